"""Integer arith ops of MLIR kernels (Mosaic TPU bodies, Triton), as Python functions: the one
table ``passes/mosaic_body.py`` and ``passes/triton.py`` evaluate index arithmetic with.
Division and remainder by zero give 0 (the kernel's value is then unmodeled upstream, never a
crash); ``divsi`` / ``remsi`` truncate toward zero as MLIR's arith dialect defines them."""

from __future__ import annotations

INT_BINARY_OPS = {"arith.addi": lambda a, b: a + b, "arith.subi": lambda a, b: a - b,
        "arith.muli": lambda a, b: a * b,
        "arith.divsi": lambda a, b: int(a / b) if b else 0,
        "arith.divui": lambda a, b: a // b if b else 0,
        "arith.floordivsi": lambda a, b: a // b if b else 0,
        "arith.ceildivsi": lambda a, b: -((-a) // b) if b else 0,
        "arith.remsi": lambda a, b: a - b * int(a / b) if b else 0,
        "arith.remui": lambda a, b: a % b if b else 0,
        "arith.minsi": min, "arith.maxsi": max, "arith.minui": min, "arith.maxui": max,
        "arith.andi": lambda a, b: a & b, "arith.ori": lambda a, b: a | b,
        "arith.xori": lambda a, b: a ^ b, "arith.shli": lambda a, b: a << b,
        "arith.shrsi": lambda a, b: a >> b, "arith.shrui": lambda a, b: a >> b}
