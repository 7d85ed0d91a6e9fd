#!/usr/bin/env python3
"""bfloat16 .npy files written by ml_dtypes (jax's dtypes) through numpy.save, read by
tests/unit/test_bfloat16.cpp. ml_dtypes saves bfloat16 with the descriptor '<V2'.
Run with the jax venv: .venv/bin/python tests/data/make_npy_bfloat16_reference.py"""
import pathlib

import ml_dtypes
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
# float32 sources (the same list is in the test); ml_dtypes rounds them to nearest even.
SOURCE = np.array([1.0, -2.5, 1 + 2**-8, 1 + 3 * 2**-8, 3.3895314e38, 3.4e38, float("inf"), float("-inf"),
                   -0.0, 2**-133, 1.0e-38, float("nan")], dtype=np.float32)
np.save(HERE / "npy_bfloat16_3x4.npy", SOURCE.astype(ml_dtypes.bfloat16).reshape(3, 4))
np.save(HERE / "npy_bfloat16_fortran_2x3.npy",
        np.asfortranarray((np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5).astype(ml_dtypes.bfloat16)))
