#pragma once
// PJRT runtime: loads a PJRT plugin at run time (libtpu.so on a TPU VM, the jax CUDA plugin
// xla_cuda_plugin.so on NVIDIA), compiles olmax's StableHLO modules and runs them. Needs the PJRT C
// API header, at least as new as the plugin (docs/xla.md, "1. The PJRT C API header").
//
// Call sequence and ownership follow the PJRT C API: dlopen (RTLD_NOW | RTLD_LOCAL, never dlclose:
// the API table points into the library) -> GetPjrtApi -> version check -> Plugin_Initialize once per
// process -> Client_Create -> Client_Compile("mlir" text + CompileOptionsProto bytes) ->
// BufferFromHostBuffer -> LoadedExecutable_Execute -> Buffer_ToHostBuffer -> events awaited and
// destroyed; teardown buffers -> executables -> client. Every PJRT_Error becomes a `pjrt_error`
// carrying the plugin's message and code.

#include <dlfcn.h>

#if __has_include(<xla/pjrt/c/pjrt_c_api.h>)
#include <xla/pjrt/c/pjrt_c_api.h>
#elif __has_include(<pjrt_c_api.h>)  // a plugin wheel's flat include/ folder
#include <pjrt_c_api.h>
#else
#error "olmax/xla/pjrt_runtime.hpp needs the PJRT C API header (xla/pjrt/c/pjrt_c_api.h, or the flat pjrt_c_api.h of the xla-cpu-pjrt wheel's include/): configure with -DOLMAX_PJRT_INCLUDE_DIR=<its folder> and link olmax::pjrt, or compile with -I<its folder> (docs/xla.md)"
#endif

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "olmax/xla/xla.hpp"

namespace olmax::xla::pjrt {

/// A PJRT call failed, or a plugin could not be loaded. `code()` is the plugin's absl status code
/// (PJRT_Error_Code: 3 INVALID_ARGUMENT, 5 NOT_FOUND, 9 FAILED_PRECONDITION, 12 UNIMPLEMENTED, ...).
class pjrt_error : public olmax::error {
public:
    explicit pjrt_error(const std::string& message, int code = PJRT_Error_Code_INTERNAL) : olmax::error(message), code_(code) {}
    int code() const { return code_; }

private:
    int code_;
};

/// The absl name of a PJRT error code.
inline std::string_view code_name(int code) {
    constexpr std::string_view names[] = {"OK",        "CANCELLED",      "UNKNOWN",     "INVALID_ARGUMENT",  "DEADLINE_EXCEEDED", "NOT_FOUND",
                                          "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
                                          "OUT_OF_RANGE",   "UNIMPLEMENTED",  "INTERNAL",    "UNAVAILABLE",       "DATA_LOSS",
                                          "UNAUTHENTICATED"};
    return code >= 0 && code <= 16 ? names[code] : std::string_view("UNKNOWN_CODE");
}

namespace detail {

/// A zeroed args struct with `struct_size` set to the header's <Name>_STRUCT_SIZE constant.
template <class Args>
Args make_args(std::size_t struct_size) {
    Args args;
    std::memset(static_cast<void*>(&args), 0, sizeof args);
    args.struct_size = struct_size;
    return args;
}

}  // namespace detail

/// A loaded, initialised plugin. One per path per process (PJRT_Plugin_Initialize runs once);
/// never unloaded.
class plugin {
public:
    /// Loads the plugin at `path`, or at $OLMAX_PJRT_PLUGIN when `path` is empty.
    static const plugin& load(std::string path = {}) {
        if (path.empty()) {
            const char* env = std::getenv(plugin_env_var);
            if (!env || !*env)
                throw pjrt_error(std::string("olmax xla: no PJRT plugin given: pass its path to olmax::xla::pjrt::plugin::load or set ") +
                                     plugin_env_var +
                                     " (XLA CPU: <site-packages>/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so from `pip install "
                                     "xla-cpu-pjrt`, which olmax's tools/setup_jax_venv.sh puts in .venv; TPU VM: "
                                     "<site-packages>/libtpu/libtpu.so; NVIDIA: <site-packages>/jax_plugins/xla_cuda13/xla_cuda_plugin.so)",
                                 PJRT_Error_Code_NOT_FOUND);
            path = env;
        }
        static std::mutex mutex;
        static std::map<std::string, std::unique_ptr<plugin>> loaded;
        std::lock_guard<std::mutex> lock(mutex);
        auto it = loaded.find(path);
        if (it != loaded.end()) return *it->second;
        std::unique_ptr<plugin> p(new plugin(path));
        return *loaded.emplace(path, std::move(p)).first->second;
    }

    const PJRT_Api* api() const { return api_; }
    const std::string& path() const { return path_; }
    int major_version() const { return major_; }
    int minor_version() const { return minor_; }

    /// The function in `slot`, if the plugin's API table is long enough to have it and it is set.
    template <class Fn>
    Fn* function(Fn* PJRT_Api::*slot, std::string_view name) const {
        const auto offset = static_cast<std::size_t>(reinterpret_cast<const char*>(&(api_->*slot)) - reinterpret_cast<const char*>(api_));
        Fn* fn = offset + sizeof(Fn*) <= api_->struct_size ? api_->*slot : nullptr;
        if (!fn)
            throw pjrt_error("olmax xla: PJRT plugin " + path_ + " (API " + version_string() + ") does not implement " + std::string(name),
                             PJRT_Error_Code_UNIMPLEMENTED);
        return fn;
    }

    /// Throws a pjrt_error for a non-null `error` (after copying its message and destroying it).
    void check(PJRT_Error* error, std::string_view what) const {
        if (!error) return;
        auto message_args = detail::make_args<PJRT_Error_Message_Args>(PJRT_Error_Message_Args_STRUCT_SIZE);
        message_args.error = error;
        api_->PJRT_Error_Message(&message_args);
        std::string message(message_args.message ? message_args.message : "", message_args.message ? message_args.message_size : 0);
        int code = PJRT_Error_Code_UNKNOWN;
        auto code_args = detail::make_args<PJRT_Error_GetCode_Args>(PJRT_Error_GetCode_Args_STRUCT_SIZE);
        code_args.error = error;
        if (PJRT_Error* inner = api_->PJRT_Error_GetCode(&code_args)) destroy_error(inner);
        else code = static_cast<int>(code_args.code);
        destroy_error(error);
        throw pjrt_error("olmax xla: " + std::string(what) + " failed [" + std::string(code_name(code)) + "]: " + message, code);
    }

    /// Blocks until `event` is ready, destroys it, and throws the first error (await or destroy).
    void await_and_destroy(PJRT_Event* event, std::string_view what) const {
        if (!event) return;
        auto await_args = detail::make_args<PJRT_Event_Await_Args>(PJRT_Event_Await_Args_STRUCT_SIZE);
        await_args.event = event;
        PJRT_Error* awaited = api_->PJRT_Event_Await(&await_args);
        auto destroy_args = detail::make_args<PJRT_Event_Destroy_Args>(PJRT_Event_Destroy_Args_STRUCT_SIZE);
        destroy_args.event = event;
        PJRT_Error* destroyed = api_->PJRT_Event_Destroy(&destroy_args);
        if (awaited) {
            if (destroyed) destroy_error(destroyed);
            check(awaited, what);
        }
        check(destroyed, std::string(what) + " (event destroy)");
    }

    void destroy_error(PJRT_Error* error) const {
        auto args = detail::make_args<PJRT_Error_Destroy_Args>(PJRT_Error_Destroy_Args_STRUCT_SIZE);
        args.error = error;
        api_->PJRT_Error_Destroy(&args);
    }

    std::string version_string() const { return std::to_string(major_) + "." + std::to_string(minor_); }

    /// Registers `handler` (an XLA typed-FFI handler, xla/ffi.hpp) as the custom-call target
    /// `target` on `platform` ("host" for the XLA CPU plugin) in the plugin's process-wide registry,
    /// through its FFI extension. Returns an empty string on success, else why it could not (no FFI
    /// extension, an older layout of the registration call, or the plugin refused it); nothing is
    /// registered then, and programs calling `target` will not compile on this plugin.
    std::string register_ffi_handler(std::string_view target, std::string_view platform, void* handler) const {
        // PJRT_FFI_Extension and PJRT_FFI_Register_Handler_Args as declared in openxla/xla's
        // xla/pjrt/c/pjrt_c_api_ffi_extension.h (Apache-2.0) since it dropped its api_version field.
        // A plugin cannot tell an earlier layout from this one, so only plugins of PJRT API 0.81 (the
        // version it was checked on) or later are tried.
        struct register_args {
            std::size_t struct_size;
            const char* target_name;
            std::size_t target_name_size;
            void* handler;
            const char* platform_name;
            std::size_t platform_name_size;
            std::uint32_t traits;
        };
        struct ffi_extension {
            PJRT_Extension_Base base;
            void* type_register;
            void* user_data_add;
            PJRT_Error* (*register_handler)(register_args*);
        };
        if (major_ == 0 && minor_ < 81) return "PJRT API " + version_string() + " is older than 0.81, the version this registration layout was checked on";
        const PJRT_Extension_Base* e = api_->extension_start;
        while (e && e->type != PJRT_Extension_Type_FFI) e = e->next;
        if (!e) return "the plugin has no FFI extension";
        if (e->struct_size < sizeof(ffi_extension)) return "the plugin's FFI extension cannot register handlers";
        const auto* ffi = reinterpret_cast<const ffi_extension*>(e);
        register_args args{offsetof(register_args, traits) + sizeof(std::uint32_t), target.data(), target.size(), handler, platform.data(),
                           platform.size(), 0};
        try {
            check(ffi->register_handler(&args), "registering the FFI handler " + std::string(target));
        } catch (const pjrt_error& refused) {
            return refused.what();
        }
        return {};
    }

    /// PJRT_Plugin_Attributes as text (e.g. "xla_version", "stablehlo_current_version" = "1.9.3",
    /// "stablehlo_minimum_version"); empty when the plugin does not implement the call.
    std::map<std::string, std::string> attributes() const {
        std::map<std::string, std::string> out;
        const auto offset = offsetof(PJRT_Api, PJRT_Plugin_Attributes);
        if (offset + sizeof(api_->PJRT_Plugin_Attributes) > api_->struct_size || !api_->PJRT_Plugin_Attributes) return out;
        auto args = detail::make_args<PJRT_Plugin_Attributes_Args>(PJRT_Plugin_Attributes_Args_STRUCT_SIZE);
        check(api_->PJRT_Plugin_Attributes(&args), "PJRT_Plugin_Attributes");
        for (std::size_t i = 0; i < args.num_attributes; ++i) {
            const PJRT_NamedValue& v = args.attributes[i];
            std::string text;
            switch (v.type) {
                case PJRT_NamedValue_kString: text.assign(v.string_value, v.value_size); break;
                case PJRT_NamedValue_kInt64: text = std::to_string(v.int64_value); break;
                case PJRT_NamedValue_kInt64List:
                    for (std::size_t j = 0; j < v.value_size; ++j) text += (j ? "." : "") + std::to_string(v.int64_array_value[j]);
                    break;
                case PJRT_NamedValue_kFloat: text = std::to_string(v.float_value); break;
                case PJRT_NamedValue_kBool: text = v.bool_value ? "true" : "false"; break;
                default: text = "?";
            }
            out.emplace(std::string(v.name, v.name_size), text);
        }
        return out;
    }

    plugin(const plugin&) = delete;
    plugin& operator=(const plugin&) = delete;

private:
    explicit plugin(std::string path) : path_(std::move(path)) {
        dlerror();
        void* handle = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);  // RTLD_LOCAL: each plugin carries its own LLVM/absl
        if (!handle)
            throw pjrt_error("olmax xla: cannot load PJRT plugin '" + path_ + "': " + last_dl_error() + " (check " + plugin_env_var +
                                 "; NVIDIA plugins must be loaded in place inside site-packages)",
                             PJRT_Error_Code_NOT_FOUND);
        using get_api_fn = const PJRT_Api* (*)();
        void* symbol = dlsym(handle, "GetPjrtApi");
        if (!symbol)
            throw pjrt_error("olmax xla: '" + path_ + "' is not a PJRT plugin: it has no GetPjrtApi symbol (" + last_dl_error() + ")",
                             PJRT_Error_Code_NOT_FOUND);
        api_ = reinterpret_cast<get_api_fn>(symbol)();
        if (!api_) throw pjrt_error("olmax xla: GetPjrtApi of '" + path_ + "' returned null", PJRT_Error_Code_INTERNAL);
        constexpr std::size_t version_end = offsetof(PJRT_Api, pjrt_api_version) + sizeof(PJRT_Api_Version);
        if (api_->struct_size < version_end)
            throw pjrt_error("olmax xla: PJRT plugin '" + path_ + "' reports an API table of " + std::to_string(api_->struct_size) +
                                 " bytes, too small to hold a version",
                             PJRT_Error_Code_FAILED_PRECONDITION);
        major_ = api_->pjrt_api_version.major_version;
        minor_ = api_->pjrt_api_version.minor_version;
        const std::string header = std::to_string(PJRT_API_MAJOR) + "." + std::to_string(PJRT_API_MINOR);
        if (major_ != PJRT_API_MAJOR)
            throw pjrt_error("olmax xla: PJRT API major version mismatch: plugin '" + path_ + "' implements " + version_string() +
                                 ", olmax was built against the PJRT C API header " + header +
                                 "; use the header from the XLA commit your plugin was built from",
                             PJRT_Error_Code_FAILED_PRECONDITION);
        if (minor_ > PJRT_API_MINOR)
            std::fprintf(stderr,
                         "olmax xla: PJRT plugin '%s' implements API %s, newer than olmax's header %s; if it rejects a struct size, "
                         "rebuild olmax with the plugin's own pjrt_c_api.h\n",
                         path_.c_str(), version_string().c_str(), header.c_str());
        auto init = detail::make_args<PJRT_Plugin_Initialize_Args>(PJRT_Plugin_Initialize_Args_STRUCT_SIZE);
        check(function(&PJRT_Api::PJRT_Plugin_Initialize, "PJRT_Plugin_Initialize")(&init), "PJRT_Plugin_Initialize");
    }

    static std::string last_dl_error() {
        const char* e = dlerror();
        return e ? e : "unknown dlopen error";
    }

    std::string path_;
    const PJRT_Api* api_ = nullptr;
    int major_ = 0, minor_ = 0;
};

/// A plugin-specific client option (PJRT_NamedValue), e.g. {"preallocate", false} for the CUDA plugin.
struct create_option {
    std::string name;
    std::variant<std::string, std::int64_t, bool, float> value;
};

class client;

/// A device buffer; keeps its client alive, so buffers are always destroyed before the client.
class device_buffer {
public:
    device_buffer() = default;
    device_buffer(device_buffer&& other) noexcept { *this = std::move(other); }
    device_buffer& operator=(device_buffer&& other) noexcept {
        if (this != &other) {
            release();
            owner_ = std::move(other.owner_);
            plugin_ = other.plugin_;
            buffer_ = std::exchange(other.buffer_, nullptr);
            dims_ = std::move(other.dims_);
        }
        return *this;
    }
    ~device_buffer() { release(); }
    const stablehlo::dims_t& dims() const { return dims_; }
    PJRT_Buffer* get() const { return buffer_; }
    /// Whether the device has released this buffer's memory: true after an execution it was donated
    /// to (an argument the module aliases to an output), whose result then lives in the output.
    bool is_deleted() const {
        if (!buffer_) return true;
        auto args = detail::make_args<PJRT_Buffer_IsDeleted_Args>(PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE);
        args.buffer = buffer_;
        plugin_->check(plugin_->api()->PJRT_Buffer_IsDeleted(&args), "PJRT_Buffer_IsDeleted");
        return args.is_deleted;
    }

private:
    friend class client;
    device_buffer(std::shared_ptr<void> owner, const plugin* p, PJRT_Buffer* buffer, stablehlo::dims_t dims)
        : owner_(std::move(owner)), plugin_(p), buffer_(buffer), dims_(std::move(dims)) {}
    void release() noexcept {
        if (buffer_) {
            auto args = detail::make_args<PJRT_Buffer_Destroy_Args>(PJRT_Buffer_Destroy_Args_STRUCT_SIZE);
            args.buffer = buffer_;
            if (PJRT_Error* e = plugin_->api()->PJRT_Buffer_Destroy(&args)) plugin_->destroy_error(e);
            buffer_ = nullptr;
        }
        owner_.reset();
    }
    std::shared_ptr<void> owner_;
    const plugin* plugin_ = nullptr;
    PJRT_Buffer* buffer_ = nullptr;
    stablehlo::dims_t dims_;
};

/// What XLA planned for one execution of a compiled program, in bytes
/// (PJRT_Executable_GetCompiledMemoryStats, the device's default memory).
struct memory_plan {
    std::int64_t arguments = 0, outputs = 0, aliased = 0, temporaries = 0;
    /// What one execution holds: its arguments, the outputs that reuse no argument, its temporaries.
    std::int64_t total() const { return arguments + outputs - aliased + temporaries; }
};

/// A compiled module (owned by its client's cache).
struct executable {
    std::string key;
    PJRT_LoadedExecutable* loaded = nullptr;
    std::size_t num_outputs = 0;
    std::optional<memory_plan> memory;  ///< empty where the plugin does not report it
    std::size_t replicas = 1;
    std::size_t partitions = 1;  ///< SPMD: one global program split over this many devices
    /// Devices one execution runs on (replicas x partitions; one of them is 1).
    std::size_t devices() const { return replicas * partitions; }
};

/// A PJRT client on the plugin's first addressable device, with compiled executables cached by
/// module key (op + shapes). Not copyable; thread-safe.
class client {
public:
    explicit client(const plugin& p, const std::vector<create_option>& options = {}) : state_(std::make_shared<state>(p)) {
        std::vector<PJRT_NamedValue> named;
        for (const auto& o : options) {
            auto v = detail::make_args<PJRT_NamedValue>(PJRT_NamedValue_STRUCT_SIZE);
            v.name = o.name.c_str();
            v.name_size = o.name.size();
            v.value_size = 1;
            if (auto s = std::get_if<std::string>(&o.value)) {
                v.type = PJRT_NamedValue_kString;
                v.string_value = s->c_str();
                v.value_size = s->size();
            } else if (auto i = std::get_if<std::int64_t>(&o.value)) {
                v.type = PJRT_NamedValue_kInt64;
                v.int64_value = *i;
            } else if (auto b = std::get_if<bool>(&o.value)) {
                v.type = PJRT_NamedValue_kBool;
                v.bool_value = *b;
            } else {
                v.type = PJRT_NamedValue_kFloat;
                v.float_value = std::get<float>(o.value);
            }
            named.push_back(v);
        }
        auto args = detail::make_args<PJRT_Client_Create_Args>(PJRT_Client_Create_Args_STRUCT_SIZE);
        args.create_options = named.data();
        args.num_options = named.size();
        p.check(p.function(&PJRT_Api::PJRT_Client_Create, "PJRT_Client_Create")(&args), "PJRT_Client_Create");
        state_->client = args.client;

        auto devices = detail::make_args<PJRT_Client_AddressableDevices_Args>(PJRT_Client_AddressableDevices_Args_STRUCT_SIZE);
        devices.client = state_->client;
        p.check(p.function(&PJRT_Api::PJRT_Client_AddressableDevices, "PJRT_Client_AddressableDevices")(&devices),
                "PJRT_Client_AddressableDevices");
        if (devices.num_addressable_devices == 0)
            throw pjrt_error("olmax xla: PJRT plugin " + p.path() + " has no addressable device", PJRT_Error_Code_NOT_FOUND);
        state_->device = devices.addressable_devices[0];
        state_->devices.assign(devices.addressable_devices, devices.addressable_devices + devices.num_addressable_devices);

        auto name = detail::make_args<PJRT_Client_PlatformName_Args>(PJRT_Client_PlatformName_Args_STRUCT_SIZE);
        name.client = state_->client;
        p.check(p.function(&PJRT_Api::PJRT_Client_PlatformName, "PJRT_Client_PlatformName")(&name), "PJRT_Client_PlatformName");
        platform_.assign(name.platform_name, name.platform_name_size);
    }

    client(const client&) = delete;
    client& operator=(const client&) = delete;

    /// "tpu", "cuda", "cpu", ... as the plugin names its platform.
    const std::string& platform_name() const { return platform_; }
    const plugin& owner() const { return *state_->owner; }
    std::size_t cached_executables() const {
        std::lock_guard<std::mutex> lock(state_->mutex);
        return state_->executables.size();
    }

    /// Compiles `module` (or returns the executable cached under its key); a module emitted for
    /// SPMD partitioning (`module.partitions` > 1) compiles for that many devices.
    const executable& compile(const stablehlo::emitted_module& module, int replicas = 1) {
        return compile(module.key, module.text, replicas, int(module.partitions));
    }

    /// Devices this client can run on (the CPU plugin has 4; `replicas` of a compile must not exceed it).
    std::size_t device_count() const { return state_->devices.size(); }

    /// Compiles `mlir_text` (or returns the executable cached under `key`); `replicas` > 1 compiles one
    /// program replicated over the first `replicas` devices (cross-replica collectives inside it);
    /// `partitions` > 1 one program that XLA's SPMD partitioner splits over the first `partitions`
    /// devices by the module's `mhlo.sharding` annotations.
    const executable& compile(const std::string& key, const std::string& mlir_text, int replicas = 1, int partitions = 1) {
        check<value_error>(replicas >= 1 && partitions >= 1 && (replicas == 1 || partitions == 1), "olmax xla: ", replicas, " replicas and ",
                           partitions, " partitions asked for; one of them must be 1");
        check<value_error>(std::size_t(replicas) * std::size_t(partitions) <= device_count(), "olmax xla: ", replicas * partitions,
                           " devices asked for, the plugin ", state_->owner->path(), " has ", device_count(), " addressable devices");
        std::lock_guard<std::mutex> lock(state_->mutex);
        // one executable per replica / partition count
        const std::string cached_as = key + (replicas > 1 ? ".replicas" + std::to_string(replicas) : "") +
                                      (partitions > 1 ? ".partitions" + std::to_string(partitions) : "");
        auto it = state_->executables.find(cached_as);
        if (it != state_->executables.end()) return *it->second;
        const plugin& p = *state_->owner;
        std::string code = mlir_text;  // PJRT_Program.code is non-const in older headers; keep alive for the call
        std::string format = "mlir";
        auto program = detail::make_args<PJRT_Program>(PJRT_Program_STRUCT_SIZE);
        program.code = code.data();
        program.code_size = code.size();
        program.format = format.c_str();
        program.format_size = format.size();
        auto args = detail::make_args<PJRT_Client_Compile_Args>(PJRT_Client_Compile_Args_STRUCT_SIZE);
        args.client = state_->client;
        args.program = &program;
        const std::string options = compile_options_for(replicas, partitions);
        args.compile_options = options.data();
        args.compile_options_size = options.size();
        p.check(p.function(&PJRT_Api::PJRT_Client_Compile, "PJRT_Client_Compile")(&args), "PJRT_Client_Compile of " + key);
        auto compiled = std::make_unique<executable>();
        compiled->key = cached_as;
        compiled->loaded = args.executable;
        compiled->replicas = std::size_t(replicas);
        compiled->partitions = std::size_t(partitions);
        try {
            describe(p, *compiled);
        } catch (...) {
            auto destroy = detail::make_args<PJRT_LoadedExecutable_Destroy_Args>(PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE);
            destroy.executable = compiled->loaded;
            if (PJRT_Error* e = p.api()->PJRT_LoadedExecutable_Destroy(&destroy)) p.destroy_error(e);
            throw;
        }
        state_->executables_order.push_back(compiled.get());
        return *state_->executables.emplace(cached_as, std::move(compiled)).first->second;
    }

    /// Copies `data` (dense row-major f32 of shape `dims`) to device `device_index` (default the first).
    device_buffer upload(const float* data, const stablehlo::dims_t& dims, std::size_t device_index = 0) {
        check<value_error>(device_index < device_count(), "olmax xla: no device ", device_index, " (", device_count(), " addressable)");
        const plugin& p = *state_->owner;
        auto args = detail::make_args<PJRT_Client_BufferFromHostBuffer_Args>(PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE);
        args.client = state_->client;
        args.data = data;
        args.type = PJRT_Buffer_Type_F32;
        args.dims = dims.data();
        args.num_dims = dims.size();
        args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
        args.device = state_->devices[device_index];  // required when no memory space is given
        p.check(p.function(&PJRT_Api::PJRT_Client_BufferFromHostBuffer, "PJRT_Client_BufferFromHostBuffer")(&args),
                "PJRT_Client_BufferFromHostBuffer");
        device_buffer buffer(state_, &p, args.buffer, dims);
        p.await_and_destroy(args.done_with_host_buffer, "host-to-device transfer");
        return buffer;
    }

    /// Runs `exe` on one device; outputs come back untupled, one buffer each.
    std::vector<device_buffer> execute(const executable& exe, const std::vector<const device_buffer*>& arguments) {
        return std::move(execute_replicated(exe, {arguments})[0]);
    }

    /// Runs a replicated or partitioned `exe` once on each of its devices at the same time, device r
    /// with `arguments[r]` (buffers on device r: a replica's inputs, or a partition's shards);
    /// returns each device's outputs.
    std::vector<std::vector<device_buffer>> execute_replicated(const executable& exe,
                                                               const std::vector<std::vector<const device_buffer*>>& arguments) {
        const plugin& p = *state_->owner;
        const std::size_t n = arguments.size();
        check<value_error>(n == exe.devices(), "olmax xla: ", exe.key, " is compiled for ", exe.devices(), " devices, got arguments for ", n);
        std::vector<std::vector<PJRT_Buffer*>> argument_list(n);
        std::vector<PJRT_Buffer* const*> argument_lists(n);
        std::vector<std::vector<PJRT_Buffer*>> output_list(n, std::vector<PJRT_Buffer*>(exe.num_outputs, nullptr));
        std::vector<PJRT_Buffer**> output_lists(n);
        std::vector<PJRT_Event*> complete(n, nullptr);
        for (std::size_t r = 0; r < n; ++r) {
            check<value_error>(arguments[r].size() == arguments[0].size(), "olmax xla: replica ", r, " of ", exe.key, " got ",
                               arguments[r].size(), " arguments, replica 0 ", arguments[0].size());
            for (const auto* a : arguments[r]) argument_list[r].push_back(a->get());
            argument_lists[r] = argument_list[r].data();
            output_lists[r] = output_list[r].data();
        }
        auto options = detail::make_args<PJRT_ExecuteOptions>(PJRT_ExecuteOptions_STRUCT_SIZE);
        auto args = detail::make_args<PJRT_LoadedExecutable_Execute_Args>(PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE);
        args.executable = exe.loaded;
        args.options = &options;
        args.argument_lists = argument_lists.data();
        args.num_devices = n;
        args.num_args = argument_list[0].size();
        args.output_lists = output_lists.data();
        args.device_complete_events = complete.data();
        PJRT_Error* error = p.function(&PJRT_Api::PJRT_LoadedExecutable_Execute, "PJRT_LoadedExecutable_Execute")(&args);
        std::vector<std::vector<device_buffer>> outputs(n);  // own the outputs first, so an error below leaks nothing
        for (std::size_t r = 0; r < n; ++r)
            for (std::size_t i = 0; i < output_list[r].size(); ++i)
                if (output_list[r][i]) outputs[r].push_back(device_buffer(state_, &p, output_list[r][i], {}));
        if (error) {
            for (PJRT_Event* event : complete)
                if (event) {
                    auto destroy = detail::make_args<PJRT_Event_Destroy_Args>(PJRT_Event_Destroy_Args_STRUCT_SIZE);
                    destroy.event = event;
                    if (PJRT_Error* e = p.api()->PJRT_Event_Destroy(&destroy)) p.destroy_error(e);
                }
            p.check(error, "PJRT_LoadedExecutable_Execute of " + exe.key);
        }
        // await every replica's event (each is destroyed) before reporting the first failure
        std::exception_ptr failure;
        for (PJRT_Event* event : complete) {
            try {
                p.await_and_destroy(event, "execution of " + exe.key);
            } catch (...) {
                if (!failure) failure = std::current_exception();
            }
        }
        if (failure) std::rethrow_exception(failure);
        for (std::size_t r = 0; r < n; ++r)
            check<pjrt_error>(outputs[r].size() == exe.num_outputs, "olmax xla: ", exe.key, " returned ", outputs[r].size(), " outputs on replica ",
                              r, ", expected ", exe.num_outputs);
        return outputs;
    }

    /// Copies a device buffer of `count` f32 values into `dst` (dense row-major).
    void download(const device_buffer& buffer, float* dst, std::size_t count) {
        const plugin& p = *state_->owner;
        auto query = detail::make_args<PJRT_Buffer_ToHostBuffer_Args>(PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE);
        query.src = buffer.get();
        p.check(p.function(&PJRT_Api::PJRT_Buffer_ToHostBuffer, "PJRT_Buffer_ToHostBuffer")(&query), "PJRT_Buffer_ToHostBuffer (size)");
        if (query.dst_size != count * sizeof(float))
            throw pjrt_error("olmax xla: device buffer holds " + std::to_string(query.dst_size) + " bytes, expected " +
                                 std::to_string(count * sizeof(float)),
                             PJRT_Error_Code_INVALID_ARGUMENT);
        auto args = detail::make_args<PJRT_Buffer_ToHostBuffer_Args>(PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE);
        args.src = buffer.get();
        args.dst = dst;
        args.dst_size = count * sizeof(float);
        p.check(p.api()->PJRT_Buffer_ToHostBuffer(&args), "PJRT_Buffer_ToHostBuffer");
        p.await_and_destroy(args.event, "device-to-host transfer");
    }

    /// Compiles (cached), uploads `inputs` (one host pointer per module input), executes and reads
    /// every output back.
    std::vector<std::vector<float>> run(const stablehlo::emitted_module& module, const std::vector<const float*>& inputs) {
        check<shape_error>(inputs.size() == module.inputs.size(), "olmax xla: ", module.key, " takes ", module.inputs.size(), " inputs, got ",
                           inputs.size());
        const executable& exe = compile(module);
        std::vector<device_buffer> buffers;
        for (std::size_t i = 0; i < inputs.size(); ++i) buffers.push_back(upload(inputs[i], module.inputs[i].dims));
        std::vector<const device_buffer*> arguments;
        for (const auto& b : buffers) arguments.push_back(&b);
        std::vector<device_buffer> outputs = execute(exe, arguments);
        check<pjrt_error>(outputs.size() == module.outputs.size(), "olmax xla: ", module.key, " returned ", outputs.size(), " outputs, expected ",
                          module.outputs.size());
        std::vector<std::vector<float>> result;
        for (std::size_t i = 0; i < outputs.size(); ++i) {
            result.emplace_back(static_cast<std::size_t>(module.outputs[i].elements()));
            download(outputs[i], result.back().data(), result.back().size());
        }
        return result;
    }

private:
    /// Sets `compiled`'s output count and, where the plugin reports it, its memory plan.
    static void describe(const plugin& p, executable& compiled) {
        auto get = detail::make_args<PJRT_LoadedExecutable_GetExecutable_Args>(PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE);
        get.loaded_executable = compiled.loaded;
        p.check(p.function(&PJRT_Api::PJRT_LoadedExecutable_GetExecutable, "PJRT_LoadedExecutable_GetExecutable")(&get),
                "PJRT_LoadedExecutable_GetExecutable");
        auto outputs = detail::make_args<PJRT_Executable_NumOutputs_Args>(PJRT_Executable_NumOutputs_Args_STRUCT_SIZE);
        outputs.executable = get.executable;
        PJRT_Error* count_error = p.function(&PJRT_Api::PJRT_Executable_NumOutputs, "PJRT_Executable_NumOutputs")(&outputs);
        if (!count_error) compiled.memory = memory_of(p, get.executable);
        auto destroy = detail::make_args<PJRT_Executable_Destroy_Args>(PJRT_Executable_Destroy_Args_STRUCT_SIZE);
        destroy.executable = get.executable;
        PJRT_Error* destroy_error = p.function(&PJRT_Api::PJRT_Executable_Destroy, "PJRT_Executable_Destroy")(&destroy);
        if (count_error && destroy_error) {
            p.destroy_error(destroy_error);
            destroy_error = nullptr;
        }
        p.check(count_error, "PJRT_Executable_NumOutputs");
        p.check(destroy_error, "PJRT_Executable_Destroy");
        compiled.num_outputs = outputs.num_outputs;
    }

    /// The plan of `e`, or none where the plugin lacks the call (an older API) or declines it.
    static std::optional<memory_plan> memory_of(const plugin& p, PJRT_Executable* e) {
        PJRT_Executable_GetCompiledMemoryStats* stats = nullptr;
        try {
            stats = p.function(&PJRT_Api::PJRT_Executable_GetCompiledMemoryStats, "PJRT_Executable_GetCompiledMemoryStats");
        } catch (const pjrt_error&) {
            return std::nullopt;
        }
        auto args = detail::make_args<PJRT_Executable_GetCompiledMemoryStats_Args>(PJRT_Executable_GetCompiledMemoryStats_Args_STRUCT_SIZE);
        args.executable = e;
        if (PJRT_Error* error = stats(&args)) {
            p.destroy_error(error);
            return std::nullopt;
        }
        return memory_plan{args.argument_size_in_bytes, args.output_size_in_bytes, args.alias_size_in_bytes, args.temp_size_in_bytes};
    }

    struct state {
        explicit state(const pjrt::plugin& p) : owner(&p) {}
        ~state() {  // executables before the client (buffers hold this state, so they are gone already)
            const PJRT_Api* api = owner->api();
            for (auto it = executables_order.rbegin(); it != executables_order.rend(); ++it) {
                auto args = detail::make_args<PJRT_LoadedExecutable_Destroy_Args>(PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE);
                args.executable = (*it)->loaded;
                if (PJRT_Error* e = api->PJRT_LoadedExecutable_Destroy(&args)) owner->destroy_error(e);
            }
            if (client) {
                auto args = detail::make_args<PJRT_Client_Destroy_Args>(PJRT_Client_Destroy_Args_STRUCT_SIZE);
                args.client = client;
                if (PJRT_Error* e = api->PJRT_Client_Destroy(&args)) owner->destroy_error(e);
            }
        }
        const pjrt::plugin* owner;
        PJRT_Client* client = nullptr;
        PJRT_Device* device = nullptr;
        std::vector<PJRT_Device*> devices;
        mutable std::mutex mutex;
        std::map<std::string, std::unique_ptr<executable>> executables;
        std::vector<executable*> executables_order;
    };
    std::shared_ptr<state> state_;
    std::string platform_;
};

}  // namespace olmax::xla::pjrt
