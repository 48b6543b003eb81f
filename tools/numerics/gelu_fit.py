#!/usr/bin/env python3
# Fits the polynomial of retrace's own GELU (src/model/gelu_kernel.cpp) and prints it as C++.
#
# For |u| >= 0.5, erfc(|u|) = exp(-u^2) * w * G(w) with w = 1/(1 + |u|) and G(w) = erfc(|u|) *
# exp(u^2) * (1 + |u|), a smooth function on |u| in [0.5, 9.2] (beyond 9.2, erfc is smaller than the
# smallest normal float; the kernel flushes Phi there). G is fitted by least squares in double
# precision, as a polynomial in s = A w + B, which maps the interval onto [-1, 1].
#
#   python3 tools/numerics/gelu_fit.py    (needs numpy)
import math

import numpy as np

Z_LO, Z_HI, DEGREE = 0.5, 9.2, 11
z = np.linspace(Z_LO, Z_HI, 400001)
w = 1 / (1 + z)
g = np.array([math.erfc(v) * math.exp(v * v) * (1 + v) for v in z])
lo, hi = 1 / (1 + Z_HI), 1 / (1 + Z_LO)
a, b = 2 / (hi - lo), -(lo + hi) / (hi - lo)
c = np.polynomial.polynomial.polyfit(a * w + b, g, DEGREE)
print(f"constexpr float kTailA = {a:.9g}f, kTailB = {b:.9g}f;")
print("constexpr float kTail[] = {" + ", ".join(f"{v:.9g}f" for v in c) + f"}};  // s^0 .. s^{DEGREE}")
print("// max relative error of the fit, in double:", np.max(np.abs(np.polynomial.polynomial.polyval(a * w + b, c) / g - 1)))
