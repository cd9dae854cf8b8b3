"""``ampscope plan``'s measurements, on top of the step and the numerics (which never import it).

fp32_steps.py  the fp32 training steps a plan watches: the user's batches, trained in order
capture.py  those steps of the user's model: every linear layer's calls and casts
casts.py    torchao's six fp8 casts of a layer, per recipe, and what each loses
fp16.py     which modules leave fp16's range: the fp32 steps, each checked in amp-fp16
timing.py   the model's GEMM shapes timed on this GPU (CUDA only)
planner.py  the GPU planned for, and the plan from the measurements (``core.plan`` decides)
verify.py   ``--verify``: the plan and what it is measured against, trained
"""

from __future__ import annotations

from ampscope.engine.plan.planner import Target, choose_gpu, plan_fp8, plan_fp16, this_gpu

__all__ = ["Target", "choose_gpu", "plan_fp8", "plan_fp16", "this_gpu"]
