// A mock PJRT plugin (shared library exporting GetPjrtApi) built from test sources against the same
// PJRT C API header as olmax's runtime. It checks every args struct_size against the header's
// constants, records the program and compile options, keeps buffers in host memory and runs a tiny
// interpreter for the modules olmax emits for add/multiply, matmul and a full sum. It counts
// live objects (leaks) and ownership-order violations (a client destroyed before its buffers).
//
// Controlled by environment variables read when GetPjrtApi is called:
//   OLMAX_MOCK_PJRT_MAJOR=<n>       report API major version n (tests the version check)
//   OLMAX_MOCK_PJRT_FAIL_EXECUTE=1  executions complete with an INTERNAL error on their event
//   OLMAX_MOCK_PJRT_DEVICE_BYTES=<n> the device holds n bytes of buffers: a buffer beyond that is a
//                                   RESOURCE_EXHAUSTED error, as a real device's allocator reports

#if __has_include(<xla/pjrt/c/pjrt_c_api.h>)
#include <xla/pjrt/c/pjrt_c_api.h>
#else
#include <pjrt_c_api.h>  // a plugin wheel's flat include/ folder
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

struct PJRT_Error {
    std::string message;
    PJRT_Error_Code code;
};
struct PJRT_Event {
    PJRT_Error* error = nullptr;  // delivered by Await (a fresh copy each time)
};
struct PJRT_Device {
    int id = 0;
};
struct PJRT_Client {
    std::atomic<int> live_buffers{0};
    std::atomic<long long> live_bytes{0};
};
struct PJRT_Buffer {
    PJRT_Client* client;
    std::vector<float> data;
    std::vector<int64_t> dims;
};
struct PJRT_LoadedExecutable {
    std::string program;
    std::string op;  // add | multiply | matmul | sum
    bool transpose_a = false, transpose_b = false;
};
struct PJRT_Executable {
    PJRT_LoadedExecutable* loaded;
};

namespace {

std::atomic<int> live_objects{0}, order_violations{0}, initialize_calls{0};
std::string last_compile_options;
bool fail_execute = false;
long long device_bytes = 0;  // 0: unlimited
PJRT_Device the_device;
PJRT_Device* device_list[1] = {&the_device};

PJRT_Error* make_error(PJRT_Error_Code code, std::string message) {
    ++live_objects;
    return new PJRT_Error{std::move(message), code};
}

template <class Args>
PJRT_Error* check_size(const Args* args, size_t expected, const char* name) {
    if (args->struct_size < expected)
        return make_error(PJRT_Error_Code_INVALID_ARGUMENT, std::string("Unexpected ") + name + " size: expected " + std::to_string(expected) +
                                                                ", got " + std::to_string(args->struct_size));
    return nullptr;
}

PJRT_Event* make_event(PJRT_Error* error = nullptr) {
    ++live_objects;
    return new PJRT_Event{error};
}

void error_destroy(PJRT_Error_Destroy_Args* args) {
    if (args->error) --live_objects;
    delete args->error;
}
void error_message(PJRT_Error_Message_Args* args) {
    args->message = args->error->message.data();
    args->message_size = args->error->message.size();
}
PJRT_Error* error_get_code(PJRT_Error_GetCode_Args* args) {
    args->code = args->error->code;
    return nullptr;
}

PJRT_Error* plugin_initialize(PJRT_Plugin_Initialize_Args* args) {
    if (auto e = check_size(args, PJRT_Plugin_Initialize_Args_STRUCT_SIZE, "PJRT_Plugin_Initialize_Args")) return e;
    if (initialize_calls++ > 0) return make_error(PJRT_Error_Code_FAILED_PRECONDITION, "mock: PJRT_Plugin_Initialize called twice");
    return nullptr;
}

PJRT_Error* plugin_attributes(PJRT_Plugin_Attributes_Args* args) {
    if (auto e = check_size(args, PJRT_Plugin_Attributes_Args_STRUCT_SIZE, "PJRT_Plugin_Attributes_Args")) return e;
    static const int64_t version[3] = {1, 9, 3};
    static PJRT_NamedValue values[2];
    std::memset(static_cast<void*>(values), 0, sizeof values);
    values[0].struct_size = values[1].struct_size = PJRT_NamedValue_STRUCT_SIZE;
    values[0].name = "stablehlo_current_version";
    values[0].name_size = std::strlen(values[0].name);
    values[0].type = PJRT_NamedValue_kInt64List;
    values[0].int64_array_value = version;
    values[0].value_size = 3;
    values[1].name = "xla_version";
    values[1].name_size = std::strlen(values[1].name);
    values[1].type = PJRT_NamedValue_kInt64;
    values[1].int64_value = 2;
    values[1].value_size = 1;
    args->attributes = values;
    args->num_attributes = 2;
    return nullptr;
}

PJRT_Error* event_destroy(PJRT_Event_Destroy_Args* args) {
    if (auto e = check_size(args, PJRT_Event_Destroy_Args_STRUCT_SIZE, "PJRT_Event_Destroy_Args")) return e;
    if (args->event) {
        --live_objects;
        if (args->event->error) {
            --live_objects;
            delete args->event->error;
        }
    }
    delete args->event;
    return nullptr;
}
PJRT_Error* event_await(PJRT_Event_Await_Args* args) {
    if (auto e = check_size(args, PJRT_Event_Await_Args_STRUCT_SIZE, "PJRT_Event_Await_Args")) return e;
    const PJRT_Error* stored = args->event->error;
    return stored ? make_error(stored->code, stored->message) : nullptr;
}

PJRT_Error* client_create(PJRT_Client_Create_Args* args) {
    if (auto e = check_size(args, PJRT_Client_Create_Args_STRUCT_SIZE, "PJRT_Client_Create_Args")) return e;
    if (initialize_calls == 0) return make_error(PJRT_Error_Code_FAILED_PRECONDITION, "mock: client created before PJRT_Plugin_Initialize");
    ++live_objects;
    args->client = new PJRT_Client;
    return nullptr;
}
PJRT_Error* client_destroy(PJRT_Client_Destroy_Args* args) {
    if (auto e = check_size(args, PJRT_Client_Destroy_Args_STRUCT_SIZE, "PJRT_Client_Destroy_Args")) return e;
    if (args->client) {
        if (args->client->live_buffers > 0) ++order_violations;
        --live_objects;
    }
    delete args->client;
    return nullptr;
}
PJRT_Error* client_platform_name(PJRT_Client_PlatformName_Args* args) {
    if (auto e = check_size(args, PJRT_Client_PlatformName_Args_STRUCT_SIZE, "PJRT_Client_PlatformName_Args")) return e;
    static const char name[] = "mock";
    args->platform_name = name;
    args->platform_name_size = 4;
    return nullptr;
}
PJRT_Error* client_addressable_devices(PJRT_Client_AddressableDevices_Args* args) {
    if (auto e = check_size(args, PJRT_Client_AddressableDevices_Args_STRUCT_SIZE, "PJRT_Client_AddressableDevices_Args")) return e;
    args->addressable_devices = device_list;
    args->num_addressable_devices = 1;
    return nullptr;
}

bool contains(const std::string& text, const char* needle) { return text.find(needle) != std::string::npos; }

PJRT_Error* client_compile(PJRT_Client_Compile_Args* args) {
    if (auto e = check_size(args, PJRT_Client_Compile_Args_STRUCT_SIZE, "PJRT_Client_Compile_Args")) return e;
    if (auto e = check_size(args->program, PJRT_Program_STRUCT_SIZE, "PJRT_Program")) return e;
    if (std::string(args->program->format, args->program->format_size) != "mlir")
        return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "mock: unsupported program format");
    if (args->compile_options_size == 0)
        return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "mock: empty compile options parse as (0, 0) replicas/partitions");
    last_compile_options.assign(args->compile_options, args->compile_options_size);
    std::string text(args->program->code, args->program->code_size);
    if (!contains(text, "func.func public @main"))
        return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "mock: failed to parse the MLIR module: no 'func.func public @main'");
    // Recognised by the module names the tests give their graphs (graph::emit(g, name, ...)): "binary"
    // add / multiply, "matmul", and "reduce" over every axis (scalar result); anything else is
    // UNIMPLEMENTED here.
    auto exe = new PJRT_LoadedExecutable;
    if (text.rfind("module @matmul ", 0) == 0) {
        exe->op = "matmul";
        exe->transpose_a = contains(text, "lhs_contracting_dimensions = [0]");
        exe->transpose_b = contains(text, "rhs_contracting_dimensions = [1]");
    } else if (text.rfind("module @reduce ", 0) == 0 && contains(text, "\"stablehlo.add\"") && contains(text, "-> (tensor<f32>) {")) {
        exe->op = "sum";
    } else if (text.rfind("module @binary ", 0) == 0 && contains(text, "\"stablehlo.add\"")) {
        exe->op = "add";
    } else if (text.rfind("module @binary ", 0) == 0 && contains(text, "\"stablehlo.multiply\"")) {
        exe->op = "multiply";
    } else {
        delete exe;
        return make_error(PJRT_Error_Code_UNIMPLEMENTED, "mock: the mock interpreter runs only add, multiply, matmul and a full sum");
    }
    exe->program = std::move(text);
    ++live_objects;
    args->executable = exe;
    return nullptr;
}

PJRT_Error* loaded_get_executable(PJRT_LoadedExecutable_GetExecutable_Args* args) {
    if (auto e = check_size(args, PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE, "PJRT_LoadedExecutable_GetExecutable_Args")) return e;
    ++live_objects;
    args->executable = new PJRT_Executable{args->loaded_executable};
    return nullptr;
}
PJRT_Error* executable_num_outputs(PJRT_Executable_NumOutputs_Args* args) {
    if (auto e = check_size(args, PJRT_Executable_NumOutputs_Args_STRUCT_SIZE, "PJRT_Executable_NumOutputs_Args")) return e;
    args->num_outputs = 1;
    return nullptr;
}
PJRT_Error* executable_destroy(PJRT_Executable_Destroy_Args* args) {
    if (auto e = check_size(args, PJRT_Executable_Destroy_Args_STRUCT_SIZE, "PJRT_Executable_Destroy_Args")) return e;
    if (args->executable) --live_objects;
    delete args->executable;
    return nullptr;
}
PJRT_Error* loaded_destroy(PJRT_LoadedExecutable_Destroy_Args* args) {
    if (auto e = check_size(args, PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE, "PJRT_LoadedExecutable_Destroy_Args")) return e;
    if (args->executable) --live_objects;
    delete args->executable;
    return nullptr;
}

PJRT_Buffer* new_buffer(PJRT_Client* client, std::vector<float> data, std::vector<int64_t> dims) {
    ++live_objects;
    ++client->live_buffers;
    client->live_bytes += static_cast<long long>(data.size() * sizeof(float));
    return new PJRT_Buffer{client, std::move(data), std::move(dims)};
}

/// RESOURCE_EXHAUSTED when `bytes` more do not fit in OLMAX_MOCK_PJRT_DEVICE_BYTES.
PJRT_Error* reserve(PJRT_Client* client, size_t bytes) {
    if (device_bytes <= 0 || client->live_bytes + static_cast<long long>(bytes) <= device_bytes) return nullptr;
    return make_error(PJRT_Error_Code_RESOURCE_EXHAUSTED, "mock: out of device memory allocating " + std::to_string(bytes) + " bytes (" +
                                                              std::to_string(client->live_bytes.load()) + " of " +
                                                              std::to_string(device_bytes) + " in use)");
}

PJRT_Error* buffer_from_host(PJRT_Client_BufferFromHostBuffer_Args* args) {
    if (auto e = check_size(args, PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE, "PJRT_Client_BufferFromHostBuffer_Args")) return e;
    if (args->type != PJRT_Buffer_Type_F32) return make_error(PJRT_Error_Code_UNIMPLEMENTED, "mock: f32 buffers only");
    if (!args->device && !args->memory) return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "mock: device must be set when memory is null");
    size_t n = 1;
    for (size_t i = 0; i < args->num_dims; ++i) n *= static_cast<size_t>(args->dims[i]);
    if (auto e = reserve(args->client, n * sizeof(float))) return e;
    const float* p = static_cast<const float*>(args->data);
    args->buffer = new_buffer(args->client, std::vector<float>(p, p + n), std::vector<int64_t>(args->dims, args->dims + args->num_dims));
    args->done_with_host_buffer = make_event();
    return nullptr;
}
PJRT_Error* buffer_destroy(PJRT_Buffer_Destroy_Args* args) {
    if (auto e = check_size(args, PJRT_Buffer_Destroy_Args_STRUCT_SIZE, "PJRT_Buffer_Destroy_Args")) return e;
    if (args->buffer) {
        --args->buffer->client->live_buffers;
        args->buffer->client->live_bytes -= static_cast<long long>(args->buffer->data.size() * sizeof(float));
        --live_objects;
    }
    delete args->buffer;
    return nullptr;
}
PJRT_Error* buffer_to_host(PJRT_Buffer_ToHostBuffer_Args* args) {
    if (auto e = check_size(args, PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE, "PJRT_Buffer_ToHostBuffer_Args")) return e;
    const size_t bytes = args->src->data.size() * sizeof(float);
    if (!args->dst) {
        args->dst_size = bytes;
        return nullptr;
    }
    if (args->dst_size < bytes) return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "mock: destination too small");
    std::memcpy(args->dst, args->src->data.data(), bytes);
    args->event = make_event();
    return nullptr;
}

PJRT_Error* execute(PJRT_LoadedExecutable_Execute_Args* args) {
    if (auto e = check_size(args, PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE, "PJRT_LoadedExecutable_Execute_Args")) return e;
    if (!args->options) return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "mock: execute options must be non-null");
    if (auto e = check_size(args->options, PJRT_ExecuteOptions_STRUCT_SIZE, "PJRT_ExecuteOptions")) return e;
    if (args->num_devices != 1) return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "mock: one device only");
    const PJRT_LoadedExecutable* exe = args->executable;
    PJRT_Buffer* const* in = args->argument_lists[0];
    const size_t expected_args = exe->op == "sum" ? 1 : 2;
    if (args->num_args != expected_args) return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "mock: wrong argument count");
    std::vector<float> out;
    std::vector<int64_t> dims;
    if (exe->op == "add" || exe->op == "multiply") {
        if (in[0]->data.size() != in[1]->data.size()) return make_error(PJRT_Error_Code_INVALID_ARGUMENT, "mock: operand sizes differ");
        out = in[0]->data;
        for (size_t i = 0; i < out.size(); ++i) out[i] = exe->op == "add" ? out[i] + in[1]->data[i] : out[i] * in[1]->data[i];
        dims = in[0]->dims;
    } else if (exe->op == "sum") {
        float total = 0;
        for (float v : in[0]->data) total += v;
        out = {total};
    } else {  // matmul, row-major, with the transposes read from the contracting dimensions
        const auto& a = in[0]->data;
        const auto& b = in[1]->data;
        const int64_t m = exe->transpose_a ? in[0]->dims[1] : in[0]->dims[0], k = exe->transpose_a ? in[0]->dims[0] : in[0]->dims[1];
        const int64_t n = exe->transpose_b ? in[1]->dims[0] : in[1]->dims[1];
        out.assign(static_cast<size_t>(m * n), 0.0f);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                float s = 0;
                for (int64_t p = 0; p < k; ++p)
                    s += a[size_t(exe->transpose_a ? p * m + i : i * k + p)] * b[size_t(exe->transpose_b ? j * k + p : p * n + j)];
                out[size_t(i * n + j)] = s;
            }
        dims = {m, n};
    }
    if (auto e = reserve(in[0]->client, out.size() * sizeof(float))) return e;
    args->output_lists[0][0] = new_buffer(in[0]->client, std::move(out), std::move(dims));
    if (args->device_complete_events)
        args->device_complete_events[0] = make_event(fail_execute ? make_error(PJRT_Error_Code_INTERNAL, "mock: injected device failure") : nullptr);
    return nullptr;
}

int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
    static PJRT_Api api;
    std::memset(static_cast<void*>(&api), 0, sizeof api);
    api.struct_size = PJRT_Api_STRUCT_SIZE;
    api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
    api.pjrt_api_version.major_version = env_int("OLMAX_MOCK_PJRT_MAJOR", PJRT_API_MAJOR);
    api.pjrt_api_version.minor_version = PJRT_API_MINOR;
    fail_execute = env_int("OLMAX_MOCK_PJRT_FAIL_EXECUTE", 0) != 0;
    device_bytes = env_int("OLMAX_MOCK_PJRT_DEVICE_BYTES", 0);
    api.PJRT_Error_Destroy = error_destroy;
    api.PJRT_Error_Message = error_message;
    api.PJRT_Error_GetCode = error_get_code;
    api.PJRT_Plugin_Initialize = plugin_initialize;
    api.PJRT_Plugin_Attributes = plugin_attributes;
    api.PJRT_Event_Destroy = event_destroy;
    api.PJRT_Event_Await = event_await;
    api.PJRT_Client_Create = client_create;
    api.PJRT_Client_Destroy = client_destroy;
    api.PJRT_Client_PlatformName = client_platform_name;
    api.PJRT_Client_AddressableDevices = client_addressable_devices;
    api.PJRT_Client_Compile = client_compile;
    api.PJRT_Client_BufferFromHostBuffer = buffer_from_host;
    api.PJRT_LoadedExecutable_GetExecutable = loaded_get_executable;
    api.PJRT_Executable_NumOutputs = executable_num_outputs;
    api.PJRT_Executable_Destroy = executable_destroy;
    api.PJRT_LoadedExecutable_Destroy = loaded_destroy;
    api.PJRT_LoadedExecutable_Execute = execute;
    api.PJRT_Buffer_Destroy = buffer_destroy;
    api.PJRT_Buffer_ToHostBuffer = buffer_to_host;
    return &api;
}

/// Test hooks (found with dlsym by the runtime test).
__attribute__((visibility("default"))) int olmax_mock_pjrt_live_objects() { return live_objects; }
__attribute__((visibility("default"))) int olmax_mock_pjrt_order_violations() { return order_violations; }
__attribute__((visibility("default"))) int olmax_mock_pjrt_initialize_calls() { return initialize_calls; }
__attribute__((visibility("default"))) const char* olmax_mock_pjrt_last_compile_options(size_t* size) {
    *size = last_compile_options.size();
    return last_compile_options.data();
}
}
