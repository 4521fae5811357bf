"""The `cudnn` source: cuDNN's engines for a kernel, their workspaces and CUDA-event times.

Written to nvidia-cudnn-frontend's Python graph API (`pip install nvidia-cudnn-frontend`):
one graph per kernel (conv_fprop, conv_dgrad or conv_wgrad on NCHW tensors), execution
plans from heuristics A plus the fallback list, every supported plan built; each plan's
workspace is what `get_workspace_size_plan_at_index` reports and its time the best of a
few runs of `execute_plan_at_index` between CUDA events, after a warm-up run. A plan that
fails to execute on this shape is skipped. Rows are named `cudnn:<GPU name>` and the
algorithm is the plan's engine name.

This needs a CUDA GPU; the development host of this project has none, so nothing in the
committed results comes from this source (its test is marked `gpu`).
"""

from __future__ import annotations

import logging
import math

import torch

from ..errors import MemplanError
from .db import Row
from .kernels import Kernel

log = logging.getLogger(__name__)

REPEATS = 5  # timed runs per plan after one warm-up; the fastest counts
_DTYPES = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BFLOAT16"}


class CudnnSource:
    """Rows measured with cuDNN's engines on the current CUDA device.

    Raises:
        MemplanError: no CUDA device, or nvidia-cudnn-frontend is not installed.
    """

    workspace_known = True

    def __init__(self, repeats: int = REPEATS):
        if not torch.cuda.is_available():
            raise MemplanError("the cudnn source needs a CUDA GPU (use --source model or cpu here)")
        try:
            import cudnn  # local: nvidia-cudnn-frontend is an optional, GPU-only dependency
        except ImportError:
            raise MemplanError("the cudnn source needs nvidia-cudnn-frontend: pip install nvidia-cudnn-frontend") from None
        self.cudnn = cudnn
        self.handle = cudnn.create_handle()
        self.repeats = repeats
        self.name = f"cudnn:{torch.cuda.get_device_name()}"

    def measure(self, kernels: list[Kernel]) -> list[Row]:
        """Every engine cuDNN offers for each kernel, with its workspace and measured time."""
        return [row for k in kernels for row in self._engines(k)]

    def _engines(self, kernel: Kernel) -> list[Row]:
        graph, pack = self._graph(kernel)
        rows = []
        for index in range(graph.get_execution_plan_count()):
            nbytes = int(graph.get_workspace_size_plan_at_index(index))
            workspace = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
            try:
                seconds = self._time(lambda ws=workspace, i=index: graph.execute_plan_at_index(
                    pack, ws, index=i, handle=self.handle))
            except Exception as exc:  # noqa: BLE001 - a plan cuDNN built but cannot run on this shape
                log.debug("cudnn plan %d of %s failed: %s", index, kernel.describe(), exc)
                continue
            rows.append(Row(kernel=kernel, algo=str(graph.get_plan_name_at_index(index)), source=self.name,
                            time_s=seconds, workspace_bytes=nbytes))
        return rows

    def _graph(self, kernel: Kernel):
        """The built graph of `kernel` and its variant pack (tensors on the GPU)."""
        cudnn = self.cudnn
        dtype = getattr(cudnn.data_type, _DTYPES[kernel.dtype])
        graph = cudnn.pygraph(io_data_type=dtype, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=self.handle)
        torch_dtype = getattr(torch, kernel.dtype)
        x = torch.randn(kernel.n, kernel.c, kernel.h, kernel.w, device="cuda", dtype=torch_dtype)
        w = torch.randn(kernel.k, kernel.c // kernel.groups, kernel.r, kernel.s, device="cuda", dtype=torch_dtype)
        y = torch.randn(kernel.n, kernel.k, kernel.out_h, kernel.out_w, device="cuda", dtype=torch_dtype)
        geometry = {"padding": [kernel.pad_h, kernel.pad_w], "stride": [kernel.stride_h, kernel.stride_w],
                    "dilation": [kernel.dil_h, kernel.dil_w]}
        tx, tw, ty = (graph.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=dtype)
                      for name, t in (("x", x), ("w", w), ("y", y)))
        if kernel.kind == "fwd":
            out, pack = graph.conv_fprop(image=tx, weight=tw, **geometry), {tx: x, tw: w}
            target = y
        elif kernel.kind == "bwd_data":
            out, pack = graph.conv_dgrad(loss=ty, filter=tw, **geometry), {ty: y, tw: w}
            target = x
        else:
            out, pack = graph.conv_wgrad(image=tx, loss=ty, **geometry), {tx: x, ty: y}
            target = w
        out.set_output(True).set_dim(list(target.shape)).set_stride(list(target.stride())).set_data_type(dtype)
        pack[out] = torch.empty_like(target)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans(cudnn.build_plan_policy.ALL)
        return graph, pack

    def _time(self, run) -> float:
        """Best seconds of `repeats` runs between CUDA events, after a warm-up run."""
        run()
        torch.cuda.synchronize()
        best = math.inf
        for _ in range(self.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) * 1e-3)
        return best
