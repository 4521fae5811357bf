"""Issue 19, regression: sqrt-n on an imported DTR log of a transformer made an invalid plan.

The log (built here, in the shape of the one the issue imported: no module paths, and
tensors created in the middle of the forward pass and released right after their use,
like an attention mask) made `memplan plan LOG --planner sqrt-n --budget 50%` exit 1 with
`recompute_input_absent`: sqrt-n recomputed the attention probabilities of a layer,
whose softmax read a mask that was released long before backward and cannot be rebuilt
(a DTR constant has no producer). It now keeps those, and the plan is valid.
"""

import json

from memplan.cli import main
from memplan.model import read_plan
from memplan.sim.stage import simulate
from memplan.sim.validate import validate
from memplan.tracing.formats import load_any

MIB = 2**20
ACT = 4 * MIB  # bytes of one activation of the sequence
HIDDEN = 4 * ACT  # the MLP's inner activations
PROBS = MIB  # attention probabilities
WEIGHT = MIB // 2


def _rec(instruction, **fields):
    return json.dumps({"INSTRUCTION": instruction, **fields})


class _Log:
    """Writes DTR log lines: constants, calls with fresh results, releases."""

    def __init__(self):
        self.lines = []

    def constant(self, name, nbytes):
        self.lines += [_rec("CONSTANT", NAME=name), _rec("MEMORY", NAME=name, MEMORY=nbytes)]

    def call(self, op, args, results, nbytes=ACT, time_ns=20_000):
        """A call making `results`: the first of `nbytes`, a second (a weight's gradient) of WEIGHT."""
        self.lines.append(_rec("CALL", NAME=op, ARGS=args, RESULT=results, TIME=time_ns))
        for r, size in zip(results, (nbytes, WEIGHT)):
            self.lines += [_rec("MEMORY", NAME=r, MEMORY=size), _rec("ALIAS", NAME=r, ALIAS=-1)]

    def release(self, *names):
        self.lines += [_rec("RELEASE", NAME=n) for n in names]


def transformer_log(layers: int = 10) -> str:
    """A DTR log of a `layers`-block transformer's forward and backward (no module paths)."""
    log = _Log()
    for i in range(layers):
        for w in ("w_qkv", "w_out", "w_fc1", "w_fc2"):
            log.constant(f"{w}{i}", WEIGHT)
    log.constant("x", ACT)
    h = "x"
    for i in range(layers):
        log.call("layer_norm", [h], [f"ln{i}"])
        log.call("matmul", [f"ln{i}", f"w_qkv{i}"], [f"qkv{i}"])
        log.constant(f"mask{i}", PROBS)  # made mid-forward, released once the softmax has read it
        log.call("masked_softmax", [f"qkv{i}", f"mask{i}"], [f"att{i}"], nbytes=PROBS)
        log.release(f"mask{i}")
        log.call("matmul", [f"att{i}", f"w_out{i}"], [f"proj{i}"])
        log.call("add", [h, f"proj{i}"], [f"r{i}"])
        log.release(f"proj{i}")
        log.call("matmul", [f"r{i}", f"w_fc1{i}"], [f"fc1_{i}"], nbytes=HIDDEN)
        log.call("gelu", [f"fc1_{i}"], [f"gelu{i}"], nbytes=HIDDEN)
        log.call("matmul", [f"gelu{i}", f"w_fc2{i}"], [f"h{i}"])
        h = f"h{i}"
    log.call("loss", [h], ["loss"], nbytes=4)
    log.lines.append(_rec("ANNOTATE", ANNOTATION="BACKWARD"))
    log.call("loss_backward", ["loss"], ["g"])
    g = "g"
    for i in reversed(range(layers)):
        log.call("matmul_backward", [g, f"gelu{i}", f"w_fc2{i}"], [f"ggelu{i}", f"gw_fc2{i}"], nbytes=HIDDEN)
        log.call("gelu_backward", [f"ggelu{i}", f"fc1_{i}"], [f"gfc1_{i}"], nbytes=HIDDEN)
        log.release(f"ggelu{i}", f"gelu{i}", f"fc1_{i}", g)
        log.call("matmul_backward", [f"gfc1_{i}", f"r{i}", f"w_fc1{i}"], [f"gr{i}", f"gw_fc1{i}"])
        log.release(f"gfc1_{i}", f"r{i}", f"h{i}")
        g = f"gr{i}"
        log.call("matmul_backward", [g, f"att{i}", f"w_out{i}"], [f"gatt{i}", f"gw_out{i}"], nbytes=PROBS)
        log.call("masked_softmax_backward", [f"gatt{i}", f"att{i}"], [f"gqkv{i}"], nbytes=PROBS)
        log.release(f"gatt{i}", f"att{i}")
        log.call("matmul_backward", [f"gqkv{i}", f"ln{i}", f"w_qkv{i}"], [f"gln{i}", f"gw_qkv{i}"])
        log.release(f"gqkv{i}", f"ln{i}", f"qkv{i}")
        prev = f"h{i - 1}" if i else "x"
        log.call("layer_norm_backward", [f"gln{i}", prev], [f"g{i}"])
        log.call("add", [g, f"g{i}"], [f"gh{i}"])
        log.release(f"gln{i}", g, f"g{i}", prev)
        g = f"gh{i}"
    return "\n".join(log.lines) + "\n"


def test_sqrt_n_plans_an_imported_transformer_log(tmp_path, capsys):
    path, out = tmp_path / "transformer.log", tmp_path / "plan.json"
    path.write_text(transformer_log())
    code = main(["plan", str(path), "--planner", "sqrt-n", "--budget", "50%", "--profile", "h100",
                 "-o", str(out), "--json"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["valid"] and summary["recomputes"] > 0
    trace = load_any(path)
    assert trace.meta["source"] == "dtr" and not any(op.module for op in trace.ops)
    plan = read_plan(out, trace)
    assert validate(trace, plan) == []
    result = simulate(trace, plan)
    assert result.feasible and result.peak_load_bytes <= plan.budget_bytes
    # The attention probabilities read a released mask: they are kept, never recomputed.
    recomputed = {trace.storages[d.storage].name for d in plan.decisions}
    assert not any(name.startswith("att") for name in recomputed)
