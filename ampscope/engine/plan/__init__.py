"""``ampscope plan``'s measurements, on top of the step and the numerics (which never import it).

capture.py  one fp32 step of the user's model: every linear layer's calls and casts
casts.py    torchao's six fp8 casts of a layer, per recipe, and what each loses
fp16.py     which modules leave fp16's range: an fp32 step, then amp-fp16 check steps
timing.py   the model's GEMM shapes timed on this GPU (CUDA only)
planner.py  the GPU planned for, and the plan from the measurements (``core.plan`` decides)
verify.py   ``--verify``: the plan and what it is measured against, trained
"""

from __future__ import annotations

from ampscope.engine.plan.planner import Target, choose_gpu, plan_fp8, plan_fp16, this_gpu

__all__ = ["Target", "choose_gpu", "plan_fp8", "plan_fp16", "this_gpu"]
