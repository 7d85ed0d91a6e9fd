#!/usr/bin/python3
"""Small .npy files written by NumPy itself, read by tests/unit/test_io.cpp.
Run: /usr/bin/python3 tests/data/make_npy_reference.py"""
import pathlib

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
np.save(HERE / "npy_float64_2x3.npy", np.arange(6, dtype=np.float64).reshape(2, 3) / 4.0)
np.save(HERE / "npy_float32_fortran_3x2.npy", np.asfortranarray(np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5))
np.save(HERE / "npy_int64_4.npy", np.array([-1, 0, 7, 2**40], dtype=np.int64))
