"""Draw docs/round-flow.png: one FedGSP round over MQTT (run: python docs/make_round_flow.py)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

lanes = [
    "coordinator /\ngroup manager",
    "broker",
    "device A\n(position 0)",
    "device B\n(position 1)",
    "device C\n(position 2)",
]
x = {name: i * 2.2 for i, name in enumerate(lanes)}
steps = [
    ("coordinator /\ngroup manager", "device A\n(position 0)", "train requests (inbox) to A, B, C", "k"),
    ("coordinator /\ngroup manager", "device A\n(position 0)", "start model frame (A's frames)", "tab:blue"),
    ("device A\n(position 0)", "device B\n(position 1)", "direct: handoff frame (B's frames)", "tab:green"),
    ("device A\n(position 0)", "coordinator /\ngroup manager", "result message (loss, samples)", "k"),
    ("device B\n(position 1)", "coordinator /\ngroup manager", "relay: result frame (group frames)", "tab:orange"),
    ("coordinator /\ngroup manager", "device C\n(position 2)", "relay: model frame forwarded", "tab:orange"),
    ("device C\n(position 2)", "coordinator /\ngroup manager", "chain end: result frame + result message", "tab:blue"),
    ("coordinator /\ngroup manager", "coordinator /\ngroup manager", "aggregate, evaluate, checkpoint", "k"),
]
fig, ax = plt.subplots(figsize=(11, 6))
for name, xi in x.items():
    ax.plot([xi, xi], [0, len(steps) + 1], color="0.7", lw=1)
    ax.text(xi, len(steps) + 1.3, name, ha="center", va="bottom", fontsize=9, weight="bold")
for i, (src, dst, label, color) in enumerate(steps):
    y = len(steps) - i
    if src == dst:
        ax.text(x[src] + 0.1, y, label, va="center", fontsize=9)
        continue
    # every MQTT message goes through the broker
    ax.annotate("", xy=(x["broker"], y), xytext=(x[src], y), arrowprops={"arrowstyle": "->", "color": color})
    ax.annotate("", xy=(x[dst], y - 0.25), xytext=(x["broker"], y), arrowprops={"arrowstyle": "->", "color": color})
    ax.text((x[src] + x[dst]) / 2, y + 0.12, label, ha="center", fontsize=8, color=color)
ax.set_xlim(-1, x[lanes[-1]] + 1.5)
ax.set_ylim(0, len(steps) + 2)
ax.axis("off")
ax.set_title("One FedGSP chain over MQTT: direct (green) and relayed (orange) hand-offs", fontsize=11)
fig.tight_layout()
fig.savefig(Path(__file__).with_name("round-flow.png"), dpi=110)
