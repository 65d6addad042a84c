"""covey on emulated Raspberry Pi boards: does it train on ARM, as on x86, and take part in runs?

Builds (or takes from the cache) the arm64 and armhf Debian bookworm board images of
``server/field/boards.py``, runs ``install-device.sh`` on the current source, and:

1. trains every small zoo model 5 steps on each install (arm64 LiteRT, arm64
   tflite-runtime, armhf tflite-runtime) and here, on the same data and seed
   (``python -m device.train_check``);
2. runs a TLS site (``covey site init``, ``covey broker run``, ``provision-device.sh``
   on the board) with the arm64 board beside two host agents: FedGSP, one chain of
   three shuffled every round, ``--rounds`` rounds, and counts the rounds the board
   trained in.

Prints ``figure board_arm64_litert_train_ok``, ``..._arm64_tflite_runtime_train_ok``,
``..._armhf_train_ok`` (1 when every model trained to x86's losses within 1e-4),
``figure board_arm64_max_abs_loss_diff`` (the largest difference of a loss between the
arm64 LiteRT board and x86, over models and the two losses), ``figure
board_arm64_rounds_trained`` of ``figure board_arm64_rounds``, the emulated training
speed of the MLP (``board_<arch>_emulated_samples_per_s``, labelled emulated: qemu-user
on this machine, not a board's speed; ``board_x86_samples_per_s`` beside it) and the
qemu version. Needs root (chroot, mounts, binfmt_misc), qemu-user-static, mmdebstrap
and mosquitto; ``./dev test`` installs them.

Usage: ``sudo .venv/bin/python bench/boards.py [--rounds 5] [--out runs/bench-boards]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("COVEY_CACHE_DIR", str(REPO / ".cache"))

from server.field.board_checks import compare_training  # noqa: E402
from server.field.board_site import BoardAgent, BoardSite  # noqa: E402
from server.field.boards import INSTALLS, EmulatedBoard, Install, cleanup_leftovers, ensure_image  # noqa: E402
from server.field.emulation import Binfmt, BoardArch, available, qemu_version  # noqa: E402
from server.paths import ensure_model, femnist_dir  # noqa: E402

TOLERANCE = 1e-4
SPEED_MODEL = "mlp_femnist"
# each install and the figure that says it trained to x86's losses
INSTALL_FIGURES: dict[tuple[BoardArch, str], str] = {
    ("arm64", "litert"): "board_arm64_litert_train_ok",
    ("arm64", "tflite-runtime"): "board_arm64_tflite_runtime_train_ok",
    ("armhf", "tflite-runtime"): "board_armhf_train_ok",
}


def install(arch: BoardArch, backend: str) -> Install:
    return next(i for i in INSTALLS[arch] if i.backend == backend)


def check_installs(boards: dict[BoardArch, EmulatedBoard], out: Path) -> None:
    """Train the small models on each install and here; print the agreement figures."""
    speed: dict[str, float] = {}
    diff = float("nan")
    for (arch, backend), figure in INSTALL_FIGURES.items():
        board, chosen = boards[arch], install(arch, backend)
        board.refresh(chosen)
        comparisons = compare_training(board, chosen, ensure_model, out / f"check-{arch}-{backend}")
        worst = max(c.max_abs_loss_diff for c in comparisons)
        for c in comparisons:
            b, h = c.board, c.host
            print(
                f"{arch} {backend}: {c.model} loss {b['train_loss']:.6f} (x86 {h['train_loss']:.6f}),"
                f" after {b['loss_after']:.6f} (x86 {h['loss_after']:.6f}),"
                f" {b['samples_per_s']:.0f} samples/s emulated",
                flush=True,
            )
            if c.model == SPEED_MODEL and backend == "tflite-runtime":
                speed[arch], speed["x86"] = b["samples_per_s"], h["samples_per_s"]
        print(f"figure {figure} = {int(worst <= TOLERANCE)}", flush=True)
        if (arch, backend) == ("arm64", "litert"):
            diff = worst
    print(f"figure board_arm64_max_abs_loss_diff = {diff:.3g}")
    for arch in ("arm64", "armhf"):
        print(f"figure board_{arch}_emulated_samples_per_s = {speed[arch]:.0f}")
    print(f"figure board_x86_samples_per_s = {speed['x86']:.0f}")


def site_run(board: EmulatedBoard, rounds: int) -> None:
    """The arm64 board in a TLS site run beside two host agents; print the rounds it trained."""
    site_dir = Path(tempfile.mkdtemp(prefix="covey-bench-boards-"))
    os.chmod(site_dir, 0o755)  # the broker's mosquitto user must enter it
    try:
        agent = BoardAgent("pi-arm64", board, install("arm64", "litert"))
        with BoardSite(site_dir, [agent], ["host-1", "host-2"], femnist_dir()) as site:
            run = site.run(
                *("--strategy", "fedgsp", "--min-devices", "3", "--rounds", str(rounds)),
                *("--set", "beta=1", "--set", "kappa=1.0", "--set", "growth=linear", "--set", "alpha=0"),
                *("--handoff", "direct", "--register-timeout", "600", "--eval-data", str(femnist_dir())),
            )
        if run.code != 0:
            print(run.output[-2000:], file=sys.stderr)
        trained = sum("pi-arm64" in r["trained_ids"] for r in run.results.get("rounds", []))
        print(f"figure board_arm64_rounds_trained = {trained}")
        print(f"figure board_arm64_rounds = {rounds}")
        platform = run.results.get("devices", {}).get("pi-arm64", {}).get("platform") or {}
        print(f"the arm64 board as it registered: {platform}")
    finally:
        shutil.rmtree(site_dir, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds of the site run (default 5)")
    p.add_argument("--out", default="runs/bench-boards", help="where the check data go")
    args = p.parse_args()
    ok, why = available()
    if not ok:
        print(f"boards.py: {why}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    major, minor = qemu_version("arm64")
    print(f"qemu-user {major}.{minor}", flush=True)
    cleanup_leftovers()
    arches: tuple[BoardArch, ...] = ("arm64", "armhf")
    with Binfmt(), contextlib.ExitStack() as stack:
        boards = {a: stack.enter_context(EmulatedBoard(a, ensure_image(a))) for a in arches}
        check_installs(boards, out)
        site_run(boards["arm64"], args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
