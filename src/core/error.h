// The error hierarchy is part of the public API (users' factories throw it too): it lives in
// include/retrace/error.h.
#pragma once

#include "retrace/error.h"
