// The one checked macro for oneDNN calls (error tier 2, see core/error.h). The C++ API reports
// failures by throwing dnnl::error; here a vendor failure means we built an invalid descriptor or
// passed a bad argument, i.e. a broken invariant, so it aborts with file, line, the call and
// oneDNN's message and status instead of propagating.
//
//   auto pd = MF_DNNL(dnnl::matmul::primitive_desc(desc, attr, engine));
//   MF_DNNL(prim.execute(stream, args));
//
// MF_DNNL(expr) is an expression with the type and value of `expr` (void allowed).
#pragma once

#include <string>

#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_debug.h>

#include "core/error.h"

namespace memfit::detail {

[[noreturn]] inline void dnnl_fail(const char * file, int line, const char * expr, const dnnl::error & e) {
    const char * status = dnnl_status2str(e.status);
    std::string msg = std::string("oneDNN call failed: ") + expr + ": " + (e.what() ? e.what() : "?") +
                      " (status " + (status ? status : "?") + ")";
    ::memfit::abort_with(file, line, msg.c_str());
}

}  // namespace memfit::detail

#define MF_DNNL(...)                                                                \
    ([&]() -> decltype(auto) {                                                      \
        try {                                                                       \
            return __VA_ARGS__;                                                     \
        } catch (const ::dnnl::error & mf_dnnl_e_) {                                \
            ::memfit::detail::dnnl_fail(__FILE__, __LINE__, #__VA_ARGS__, mf_dnnl_e_); \
        }                                                                           \
    }())
