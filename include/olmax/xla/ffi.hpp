#pragma once
// XLA's typed FFI (foreign function interface) as a handler sees it: a program's
// `stablehlo.custom_call` with api_version 4 calls a C function the plugin has registered under the
// call's target name (pjrt::plugin::register_ffi_handler; olmax's: trace/native_calls.hpp), with a
// call frame holding the operand and result buffers and the call's attributes.
//
// The structs below restate the layout of the subset of XLA's FFI C API that a handler reads
// (xla/ffi/api/c_api.h of openxla/xla, Apache-2.0; version 0.1 and every later one seen so far keep
// these layouts and fields in this order), because the PJRT plugin wheels ship only pjrt_c_api.h.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <string>
#include <string_view>

#include "olmax/core/error.hpp"

namespace olmax::xla::ffi {

struct error;  // XLA_FFI_Error: opaque, owned by XLA once a handler returns it

struct extension_base {  // XLA_FFI_Extension_Base
    std::size_t struct_size;
    int type;  // 1: the metadata extension
    extension_base* next;
};
struct api_version {  // XLA_FFI_Api_Version
    std::size_t struct_size;
    extension_base* extension_start;
    int major_version;
    int minor_version;
};
struct metadata {  // XLA_FFI_Metadata (newer versions append fields; only these are written)
    std::size_t struct_size;
    api_version version;
    std::uint32_t traits;
};
struct metadata_extension {  // XLA_FFI_Metadata_Extension
    extension_base base;
    metadata* data;
};
struct buffer {  // XLA_FFI_Buffer
    std::size_t struct_size;
    extension_base* extension_start;
    int dtype;  // XLA_FFI_DataType: 11 is F32
    void* data;
    std::int64_t rank;
    std::int64_t* dims;
};
struct list {  // XLA_FFI_Args and XLA_FFI_Rets: `types` 1 is a buffer
    std::size_t struct_size;
    extension_base* extension_start;
    std::int64_t size;
    int* types;
    void** items;
};
struct byte_span {
    const char* ptr;
    std::size_t len;
};
struct scalar {  // XLA_FFI_Scalar: dtype 5 is S64
    int dtype;
    void* value;
};
struct attributes {  // XLA_FFI_Attrs, sorted by name; `types` 3 is a scalar
    std::size_t struct_size;
    extension_base* extension_start;
    std::int64_t size;
    int* types;
    byte_span** names;
    void** items;
};
struct error_create_args {  // XLA_FFI_Error_Create_Args
    std::size_t struct_size;
    extension_base* extension_start;
    const char* message;
    int code;  // XLA_FFI_Error_Code: 3 INVALID_ARGUMENT, 13 INTERNAL
};
struct api {  // XLA_FFI_Api, up to its first function
    std::size_t struct_size;
    extension_base* extension_start;
    api_version version;
    const void* internal_api;
    error* (*error_create)(error_create_args*);
};
struct call_frame {  // XLA_FFI_CallFrame
    std::size_t struct_size;
    extension_base* extension_start;
    const api* xla;
    void* context;
    int stage;  // XLA_FFI_ExecutionStage: 3 is EXECUTE
    list args;
    list rets;
    attributes attrs;
    void* future;
};
using handler = error* (*)(call_frame*);

/// The FFI API version olmax's handlers declare: the oldest whose call frame has the layout above.
inline constexpr int handler_api_major = 0, handler_api_minor = 1;

/// A handler's view of one call: f32 buffers checked by index, kind and rank, and i64 attributes by
/// name. A bad call throws olmax::value_error naming the handler (handle() turns it into an XLA error).
class call {
public:
    call(const call_frame& frame, std::string_view name) : frame_(frame), name_(name) {}

    float* operand(std::size_t i, std::size_t rank) const { return f32(true, i, rank); }
    float* result(std::size_t i, std::size_t rank) const { return f32(false, i, rank); }
    /// Extent `d` of operand `i`.
    std::int64_t operand_dim(std::size_t i, std::size_t d) const {
        const buffer& b = at(true, i);
        check<value_error>(std::int64_t(d) < b.rank, "olmax native call ", name_, ": operand ", i, " has rank ", b.rank, ", not above ", d);
        return b.dims[d];
    }
    std::int64_t i64(std::string_view attribute) const {
        for (std::int64_t k = 0; k < frame_.attrs.size; ++k) {
            const byte_span& n = *frame_.attrs.names[k];
            if (std::string_view(n.ptr, n.len) != attribute) continue;
            const auto* s = static_cast<const scalar*>(frame_.attrs.items[k]);
            check<value_error>(frame_.attrs.types[k] == 3 && s->dtype == 5, "olmax native call ", name_, ": attribute ", attribute,
                               " is not an i64 scalar");
            return *static_cast<const std::int64_t*>(s->value);
        }
        throw value_error("olmax native call " + std::string(name_) + ": no attribute " + std::string(attribute));
    }
    /// Checks that buffer (operands or results) `i` has extents `dims`.
    void expect(bool is_operand, std::size_t i, std::initializer_list<std::int64_t> dims) const {
        const buffer& b = at(is_operand, i);
        bool same = std::size_t(b.rank) == dims.size();
        std::size_t d = 0;
        for (auto e : dims) same = same && b.dims[d++] == e;
        check<value_error>(same, "olmax native call ", name_, ": ", is_operand ? "operand " : "result ", i, " has the wrong shape");
    }

private:
    /// Operand or result `i`, which must exist and be a buffer.
    const buffer& at(bool is_operand, std::size_t i) const {
        const list& l = is_operand ? frame_.args : frame_.rets;
        check<value_error>(std::int64_t(i) < l.size && l.types[i] == 1, "olmax native call ", name_, ": no ",
                           is_operand ? "operand" : "result", " buffer ", i);
        return *static_cast<const buffer*>(l.items[i]);
    }
    float* f32(bool is_operand, std::size_t i, std::size_t rank) const {
        const buffer& b = at(is_operand, i);
        check<value_error>(b.dtype == 11 && std::size_t(b.rank) == rank, "olmax native call ", name_, ": ",
                           is_operand ? "operand " : "result ", i, " is not an f32 tensor of rank ", rank);
        return static_cast<float*>(b.data);
    }
    const call_frame& frame_;
    std::string_view name_;
};

/// The body of a typed FFI handler: answers XLA's metadata query (the API version above), runs
/// `body(call)` at the execute stage only, and returns every exception as an XLA error whose
/// message names the handler, so nothing is thrown across XLA's threads.
template <class Body>
error* handle(call_frame* frame, std::string_view name, Body&& body) noexcept {
    for (extension_base* e = frame->extension_start; e; e = e->next) {
        if (e->type != 1) continue;
        metadata* m = reinterpret_cast<metadata_extension*>(e)->data;
        m->version.major_version = handler_api_major;
        m->version.minor_version = handler_api_minor;
        m->traits = 0;
        return nullptr;
    }
    if (frame->stage != 3) return nullptr;
    std::string message;
    try {
        body(call(*frame, name));
        return nullptr;
    } catch (const std::exception& e) {
        message = e.what();
    } catch (...) {
        message = "olmax native call " + std::string(name) + ": unknown exception";
    }
    error_create_args args{sizeof(error_create_args), nullptr, message.c_str(), 13};
    return frame->xla->error_create(&args);
}

}  // namespace olmax::xla::ffi
