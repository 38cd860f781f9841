// Each kernel family registers its launch functions on the extension module (<family>_bind.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace cula {

void bind_simple_gla(pybind11::module_& m);
void bind_gated_delta_rule(pybind11::module_& m);

}  // namespace cula
