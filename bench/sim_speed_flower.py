"""The Flower side of ``bench/sim_speed.py``: run inside the benchmark's own Flower
virtualenv (``flwr[simulation]``, CPU PyTorch), never imported by covey.

``check``: the PyTorch MLP's logits on a batch and its weights after one SGD step
from given weights (compared with covey's by ``sim_speed.py``).
``run``: FedAvg over the FEMNIST writers with Flower's simulation engine (Ray), a
PyTorch client as in Flower's quickstart (``NumPyClient``: set the parameters, train
with SGD over a ``DataLoader``, return the parameters; evaluate on the local test
set), every writer evaluated every round as covey does (``--eval-every N``: every N
rounds and after the last, 0: never, as covey's ``--federated-eval-every``); writes the
time at the end of every round and the accuracy to a JSON file.

Usage: ``python bench/sim_speed_flower.py check|run ...`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import json
import time
from importlib.metadata import version
from typing import Any

import numpy as np
import torch
from torch import nn

# The MLP 784-512-62: covey's manifest names its tensors layer0_dense/kernel (512 x 784),
# layer0_dense/bias, layer1_dense/kernel (62 x 512), layer1_dense/bias, in this order,
# which is torch.nn.Linear's (out, in) layout.


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 62))


def set_weights(model: nn.Module, arrays: list[np.ndarray]) -> None:
    with torch.no_grad():
        for p, a in zip(model.parameters(), arrays, strict=True):
            p.copy_(torch.from_numpy(np.asarray(a, np.float32).reshape(p.shape)))


def get_weights(model: nn.Module) -> list[np.ndarray]:
    return [p.detach().cpu().numpy().copy() for p in model.parameters()]


def train(model: nn.Module, loader: Any, epochs: int, lr: float) -> float:
    """Plain mini-batch SGD on the mean cross-entropy (covey's local training)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    total, seen = 0.0, 0
    model.train()
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item() * len(yb)
            seen += len(yb)
    return total / max(seen, 1)


def test(model: nn.Module, loader: Any) -> tuple[float, int, int]:
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    loss, correct, n = 0.0, 0, 0
    model.eval()
    with torch.no_grad():
        for xb, yb in loader:
            out = model(xb)
            loss += float(loss_fn(out, yb))
            correct += int((out.argmax(1) == yb).sum())
            n += len(yb)
    return loss / max(n, 1), correct, n


def _load_init(path: str) -> list[np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        return [f[f"w{i}"] for i in range(len(f.files))]


def cmd_check(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    model = make_model()
    set_weights(model, _load_init(args.init))
    with np.load(args.batch, allow_pickle=False) as f:
        x, y = torch.from_numpy(f["x"]), torch.from_numpy(f["y"].astype(np.int64))
    with torch.no_grad():
        logits = model(x).numpy()
    train(model, [(x, y)], 1, args.lr)
    np.savez(args.out, logits=logits, **{f"w{i}": a for i, a in enumerate(get_weights(model))})


def cmd_run(args: argparse.Namespace) -> None:
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation
    from torch.utils.data import DataLoader, TensorDataset

    with np.load(args.data, allow_pickle=False) as f:
        users = [str(u) for u in f["users"]]
        data = {
            i: tuple(
                torch.from_numpy(f[f"{part}_{k}_{i}"].astype(dtype))
                for part in ("train", "test")
                for k, dtype in (("x", np.float32), ("y", np.int64))
            )
            for i in range(len(users))
        }
    init = _load_init(args.init)

    class FlowerClient(NumPyClient):
        def __init__(self, cid: int) -> None:
            torch.set_num_threads(1)
            self.net = make_model()
            x, y, tx, ty = data[cid]
            self.train_loader = DataLoader(TensorDataset(x, y), batch_size=args.batch, shuffle=True)
            self.test_loader = DataLoader(TensorDataset(tx, ty), batch_size=256)

        def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict]:
            set_weights(self.net, parameters)
            loss = train(self.net, self.train_loader, args.epochs, args.lr)
            return get_weights(self.net), len(self.train_loader.dataset), {"loss": loss}

        def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[float, int, dict]:
            set_weights(self.net, parameters)
            loss, correct, n = test(self.net, self.test_loader)
            return loss, n, {"correct": correct}

    def client_fn(context: Context) -> Any:
        return FlowerClient(int(context.node_config["partition-id"])).to_client()

    ends: dict[int, float] = {}  # round -> the end of its last step (fit, or evaluation when it has one)
    accuracy: list[float] = []
    every = args.eval_every

    class TimedFedAvg(FedAvg):
        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            out = super().aggregate_fit(server_round, results, failures)
            ends[server_round] = time.perf_counter()
            return out

        def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> Any:
            # as covey's --federated-eval-every: every N rounds and after the last; 0: never
            due = every > 0 and (server_round % every == 0 or server_round == args.rounds)
            return super().configure_evaluate(server_round, parameters, client_manager) if due else []

        def aggregate_evaluate(self, server_round: int, results: Any, failures: Any) -> Any:
            out = super().aggregate_evaluate(server_round, results, failures)
            correct = sum(r.metrics["correct"] for _, r in results)
            n = sum(r.num_examples for _, r in results)
            accuracy.append(correct / max(n, 1))
            ends[server_round] = time.perf_counter()
            return out

    n = len(users)
    strategy = TimedFedAvg(
        fraction_fit=args.clients_per_round / n,
        min_fit_clients=args.clients_per_round,
        fraction_evaluate=1.0,
        min_evaluate_clients=n,
        min_available_clients=n,
        initial_parameters=ndarrays_to_parameters(init),
    )

    def server_fn(context: Context) -> ServerAppComponents:
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=args.rounds))

    start = time.perf_counter()
    run_simulation(
        server_app=ServerApp(server_fn=server_fn),
        client_app=ClientApp(client_fn=client_fn),
        num_supernodes=n,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    round_s = np.diff([start, *(ends[r] for r in sorted(ends))]).tolist()
    versions = {p: version(p) for p in ("flwr", "ray", "torch")}
    with open(args.json, "w") as out:
        json.dump({"round_s": round_s, "accuracy": accuracy, "versions": versions}, out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--init", required=True)
    c.add_argument("--batch", required=True)
    c.add_argument("--lr", type=float, required=True)
    c.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--data", required=True)
    r.add_argument("--init", required=True)
    r.add_argument("--rounds", type=int, required=True)
    r.add_argument("--clients-per-round", type=int, required=True)
    r.add_argument("--epochs", type=int, required=True)
    r.add_argument("--batch", type=int, required=True)
    r.add_argument("--lr", type=float, required=True)
    r.add_argument("--json", required=True)
    r.add_argument("--eval-every", type=int, default=1, help="federated evaluation every N rounds (0: never)")
    args = p.parse_args()
    if args.cmd == "run" and args.eval_every < 0:
        p.error("--eval-every must be 0 or more")
    (cmd_check if args.cmd == "check" else cmd_run)(args)


if __name__ == "__main__":
    main()
