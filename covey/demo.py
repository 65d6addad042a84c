"""``covey demo``: train a zoo model with the LiteRT runtime on the FEMNIST sample.

Until the MQTT runtime lands this is a local run: the writers' data sets are visited
one after another each epoch (a single sequential chain, as in FedGSP's STP with one
group), through the same ``train`` signature a board runs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np


def run_local_demo(model_name: str, epochs: int, out_dir: Path, data_dir: str | None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tqdm import tqdm

    from covey.paths import ensure_model, femnist_dir
    from device.data import read_leaf
    from device.runtime import TFLiteModel

    root = Path(data_dir) if data_dir else femnist_dir()
    train = read_leaf(root / "train")
    test = read_leaf(root / "test")
    x_test = np.concatenate([d.x for d in test.values()])
    y_test = np.concatenate([d.y for d in test.values()])
    print(
        f"FEMNIST sample: {len(train)} writers, {sum(len(d) for d in train.values())} train / "
        f"{len(y_test)} test samples"
    )
    print(f"building or loading {model_name} ...")
    model = TFLiteModel(ensure_model(model_name))
    print(f"{model_name}: {model.n_params:,} parameters, interpreter {model.backend.name} {model.backend.version}")

    rng = np.random.default_rng(0)
    history: list[dict[str, float]] = []
    start = time.perf_counter()
    first = model.evaluate(x_test, y_test)
    history.append({"epoch": 0, "test_accuracy": first.accuracy, "test_loss": first.loss})
    writers = list(train)
    for epoch in range(1, epochs + 1):
        order = rng.permutation(len(writers))
        losses, seen = 0.0, 0
        for i in tqdm(order, desc=f"epoch {epoch}/{epochs}", unit="writer"):
            data = train[writers[i]]
            result = model.train(data.x, data.y, epochs=1, batch_size=5, lr=0.01, seed=rng)
            losses += result.mean_loss * len(data)
            seen += len(data)
        ev = model.evaluate(x_test, y_test)
        history.append(
            {"epoch": epoch, "test_accuracy": ev.accuracy, "test_loss": ev.loss, "train_loss": losses / seen}
        )
        print(f"epoch {epoch}: train loss {losses / seen:.3f}, test accuracy {ev.accuracy:.2%}")

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(json.dumps(history, indent=2) + "\n")
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    ax[0].plot([h["epoch"] for h in history], [100 * h["test_accuracy"] for h in history], marker="o")
    ax[0].set(xlabel="epoch", ylabel="test accuracy (%)", title=f"{model_name} on FEMNIST sample")
    ax[1].plot([h["epoch"] for h in history], [h["test_loss"] for h in history], marker="o", label="test")
    ax[1].plot([h["epoch"] for h in history[1:]], [h["train_loss"] for h in history[1:]], marker="o", label="train")
    ax[1].set(xlabel="epoch", ylabel="loss")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(out_dir / "demo.png", dpi=120)
    plt.close(fig)
    print(
        f"final test accuracy {history[-1]['test_accuracy']:.2%} after {time.perf_counter() - start:.0f} s; "
        f"plot {out_dir / 'demo.png'}, metrics {out_dir / 'metrics.json'}"
    )
    return 0
