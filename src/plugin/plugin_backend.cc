#include "plugin_backend.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "plugin_abi.h"
#include "plugin_table.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"

namespace tessel::plugin {
namespace {

// The version-2 member; a table shorter than this has none (the host reads only what fits).
constexpr size_t kForwardWithContextEnd =
    offsetof(tessel_plugin_backend, forward_with_context) + sizeof(tessel_plugin_backend::forward_with_context);

bool has_forward_with_context(const tessel_plugin_backend& table) {
  return table.struct_size >= kForwardWithContextEnd && table.forward_with_context != nullptr;
}

// An open library and its validated table. Closed (after shutdown) when the last backend,
// builder, impl or plan referring to it is gone.
struct PluginLibrary {
  void* handle = nullptr;
  std::string path;
  std::string symbol;
  tessel_plugin_backend table{};

  ~PluginLibrary() {
    if (table.shutdown) table.shutdown(table.user_data);
    if (handle) dlclose(handle);
  }
  std::string describe() const { return "plugin '" + std::string(table.name ? table.name : "?") + "' (" + path + ")"; }
};

[[noreturn]] void fail_status(const PluginLibrary& library, const char* what, tessel_status status, const tessel_error& error) {
  throw Error(detail::concat(library.describe(), " ", what, " failed (status ", status_name(status), "): ",
                             error.message[0] ? error.message : "no message"));
}

template <typename T>
std::vector<T> from_bits(uint32_t mask, int count) {
  std::vector<T> out;
  for (int i = 0; i < count; ++i)
    if (mask & TESSEL_BIT(i)) out.push_back(static_cast<T>(i));
  return out;
}

struct PluginMetadata : Metadata {
  std::shared_ptr<PluginLibrary> library;
  void* plan = nullptr;
  // A plugin's update_step changes its plan: forwards that call it hold this lock from
  // update_step to the end of forward, so threads sharing the plan see their own step.
  mutable std::mutex step_mutex;
  ~PluginMetadata() override {
    if (plan) library->table.destroy_plan(library->table.user_data, plan);
  }
};

class PluginBuilder : public MetadataBuilder {
 public:
  PluginBuilder(std::shared_ptr<const Backend> backend, std::shared_ptr<PluginLibrary> library)
      : backend_(std::move(backend)), library_(std::move(library)) {}

  std::shared_ptr<Metadata> plan(const ExecContext&, const PatternSpec& spec, ModuleType module,
                                 const AttentionShape& shape) override {
    check_plan_request(*backend_, spec, module, shape);
    const CPatternSpec c_spec(spec);
    const tessel_plan_request request = to_c(shape, module);
    auto metadata = std::make_shared<PluginMetadata>();
    metadata->library = library_;
    metadata->set_request(backend_->name(), spec, module, shape);
    tessel_error error{};
    const tessel_plugin_backend& table = library_->table;
    const tessel_status status = table.plan(table.user_data, c_spec.get(), &request, &metadata->plan, &error);
    if (status != TESSEL_OK) {
      metadata->plan = nullptr;  // a failing plan owns nothing
      fail_status(*library_, "plan", status, error);
    }
    return metadata;
  }

 private:
  std::shared_ptr<const Backend> backend_;
  std::shared_ptr<PluginLibrary> library_;
};

class PluginImpl : public Impl {
 public:
  explicit PluginImpl(std::shared_ptr<PluginLibrary> library) : library_(std::move(library)) {}

  ForwardStats forward(const ExecContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const Metadata& metadata, const StepInfo& step, const TensorView& out,
                       const TensorView& lse) override {
    const auto* plugin_metadata = dynamic_cast<const PluginMetadata*>(&metadata);
    if (plugin_metadata == nullptr || plugin_metadata->library != library_)
      fail_argument("metadata", "a plan made by " + library_->describe(), "a plan from backend '" + metadata.backend + "'");
    check_forward_shape(metadata, q, k, v);
    const tessel_tensor cq = to_c(q), ck = to_c(k), cv = to_c(v), cout = to_c(out);
    const tessel_tensor clse = lse.empty() ? tessel_tensor{} : to_c(lse);
    tessel_forward_stats stats{metadata.planned_density(), 0.0};
    tessel_error error{};
    const tessel_plugin_backend& table = library_->table;
    if (has_forward_with_context(table)) {
      const tessel_exec_context c_ctx = to_c(ctx, step);
      const tessel_status status = table.forward_with_context(table.user_data, plugin_metadata->plan, &c_ctx, &cq, &ck,
                                                              &cv, &cout, lse.empty() ? nullptr : &clse, &stats, &error);
      if (status != TESSEL_OK) fail_status(*library_, "forward_with_context", status, error);
      return ForwardStats{stats.density, stats.estimate_ms};
    }
    // A version-1 plugin: the step reaches it through update_step (when it has one and a step is given).
    std::unique_lock<std::mutex> step_lock;
    if (table.update_step != nullptr && step.step) {
      step_lock = std::unique_lock<std::mutex>(plugin_metadata->step_mutex);
      const tessel_step_info info{*step.step, step.total_steps,
                                  step.density.value_or(metadata.spec.topk_ratio.value_or(std::nan("")))};
      const tessel_status status = table.update_step(table.user_data, plugin_metadata->plan, &info, &error);
      if (status != TESSEL_OK) fail_status(*library_, "update_step", status, error);
    }
    const tessel_status status = table.forward(table.user_data, plugin_metadata->plan, &cq, &ck, &cv, &cout,
                                               lse.empty() ? nullptr : &clse, &stats, &error);
    if (status != TESSEL_OK) fail_status(*library_, "forward", status, error);
    return ForwardStats{stats.density, stats.estimate_ms};
  }

 private:
  std::shared_ptr<PluginLibrary> library_;
};

class PluginBackend : public Backend, public std::enable_shared_from_this<PluginBackend> {
 public:
  explicit PluginBackend(std::shared_ptr<PluginLibrary> library) : library_(std::move(library)) {}

  std::string name() const override { return library_->table.name; }
  std::vector<PatternType> supported_patterns() const override {
    return from_bits<PatternType>(library_->table.pattern_mask, kNumPatternTypes);
  }
  std::vector<ModuleType> supported_module_types() const override {
    return from_bits<ModuleType>(library_->table.module_mask, kNumModuleTypes);
  }
  std::vector<DeviceType> supported_devices() const override { return from_bits<DeviceType>(library_->table.device_mask, 2); }
  int score() const override { return library_->table.score; }
  std::string origin() const override {
    return library_->symbol == TESSEL_PLUGIN_ENTRY_SYMBOL ? library_->path : library_->path + ":" + library_->symbol;
  }
  void validate_config(const ResolvedSparseAttnConfig& config) const override {
    const tessel_plugin_backend& table = library_->table;
    if (table.validate_config == nullptr) return;
    tessel_error error{};
    const tessel_status status = table.validate_config(table.user_data, config.json().c_str(), &error);
    if (status != TESSEL_OK) fail_status(*library_, "validate_config", status, error);
  }
  std::unique_ptr<MetadataBuilder> make_metadata_builder() const override {
    return std::make_unique<PluginBuilder>(shared_from_this(), library_);
  }
  std::unique_ptr<Impl> make_impl() const override { return std::make_unique<PluginImpl>(library_); }

 private:
  std::shared_ptr<PluginLibrary> library_;
};

// Libraries this loader opened, by the path the dynamic linker knows them under: any other library
// already in the process (libc, libm, libtessel itself) is a dependency, never a plugin.
std::set<std::string>& plugin_libraries() {
  static std::set<std::string> libraries;
  return libraries;
}
std::mutex& plugin_libraries_mutex() {
  static std::mutex mutex;
  return mutex;
}

// The entry symbol must be a function defined by the library itself: dlsym also finds the symbols
// of its dependencies (`lib.so:printf` is libc's printf) and data objects, and calling either as
// the entry point would crash or worse.
void check_entry_symbol(const std::string& where, void* handle, void* entry, const std::string& symbol) {
  link_map* library = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &library) != 0 || library == nullptr)
    throw Error(where + ": cannot inspect the loaded library");
  Dl_info info{};
  ElfW(Sym)* elf_symbol = nullptr;
  if (dladdr1(entry, &info, reinterpret_cast<void**>(&elf_symbol), RTLD_DL_SYMENT) == 0 || info.dli_fname == nullptr)
    throw Error(where + ": entry symbol '" + symbol + "' lies in no loaded library");
  if (std::strcmp(info.dli_fname, library->l_name) != 0)
    throw Error(where + ": entry symbol '" + symbol + "' is not defined by this library but by its dependency " +
                info.dli_fname + " (a tessel plugin defines its own entry point)");
  if (elf_symbol == nullptr || ELF64_ST_TYPE(elf_symbol->st_info) != STT_FUNC)
    throw Error(where + ": entry symbol '" + symbol + "' is not a function (a tessel plugin's entry point is one)");
}

// A function pointer of the table must point into code of a loaded library; a table filled by a
// function that is no tessel entry point holds arbitrary values.
void check_code_pointer(const std::string& where, const void* pointer, const char* field) {
  Dl_info info{};
  if (pointer != nullptr && (dladdr(pointer, &info) == 0 || info.dli_fname == nullptr))
    throw Error(where + ": invalid table: '" + field + "' points into no loaded library (the entry point did not fill a plugin table)");
}

// Takes the raw int: a symbol that is no plugin entry point returns any value, and holding a
// value outside the enumeration in a tessel_status object is undefined behaviour.
bool is_known_status(int status) {
  switch (status) {
    case TESSEL_OK:
    case TESSEL_ERROR_INVALID_ARGUMENT:
    case TESSEL_ERROR_UNSUPPORTED:
    case TESSEL_ERROR_OUT_OF_MEMORY:
    case TESSEL_ERROR_ABI:
    case TESSEL_ERROR_INTERNAL: return true;
  }
  return false;
}

// Every function pointer of a checked table must point into code of a loaded library; a table
// filled by a function that is no tessel entry point holds arbitrary values.
void check_code_pointers(const std::string& where, const tessel_plugin_backend& table) {
  check_code_pointer(where, reinterpret_cast<const void*>(table.plan), "plan");
  check_code_pointer(where, reinterpret_cast<const void*>(table.forward), "forward");
  check_code_pointer(where, reinterpret_cast<const void*>(table.destroy_plan), "destroy_plan");
  check_code_pointer(where, reinterpret_cast<const void*>(table.update_step), "update_step");
  check_code_pointer(where, reinterpret_cast<const void*>(table.validate_config), "validate_config");
  check_code_pointer(where, reinterpret_cast<const void*>(table.shutdown), "shutdown");
  check_code_pointer(where, reinterpret_cast<const void*>(table.forward_with_context), "forward_with_context");
}

}  // namespace

std::shared_ptr<Backend> load_plugin_backend(const std::string& path, const std::string& symbol) {
  const std::string where =
      "plugin " + quoted_excerpt(path, 200) + (symbol == TESSEL_PLUGIN_ENTRY_SYMBOL ? "" : " (entry " + quoted_excerpt(symbol) + ")");
  std::error_code ec;
  const std::filesystem::file_status file = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(file)) throw Error(where + ": file not found");
  if (!std::filesystem::is_regular_file(file)) throw Error(where + ": not a regular file (a directory, device or FIFO)");
  auto library = std::make_shared<PluginLibrary>();
  library->path = path;
  library->symbol = symbol;
  // dlopen searches the system library folders for a name without '/': load this very file.
  const std::string absolute = std::filesystem::absolute(path, ec).string();
  const std::string load_path = ec ? path : absolute;
  std::lock_guard<std::mutex> lock(plugin_libraries_mutex());
  if (void* already = dlopen(load_path.c_str(), RTLD_LAZY | RTLD_NOLOAD)) {
    link_map* loaded = nullptr;
    const bool known = dlinfo(already, RTLD_DI_LINKMAP, &loaded) == 0 && loaded != nullptr &&
                       plugin_libraries().count(loaded->l_name) > 0;
    dlclose(already);
    if (!known)
      throw Error(where + ": a library this process already uses (a dependency such as the C library), not a tessel plugin");
  }
  library->handle = dlopen(load_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library->handle == nullptr) {
    const char* reason = dlerror();
    throw Error(where + ": cannot load the shared library: " + (reason ? reason : "unknown reason"));
  }
  dlerror();
  void* entry = dlsym(library->handle, symbol.c_str());
  if (entry == nullptr)
    throw Error(where + ": missing entry symbol " + quoted_excerpt(symbol) + " (a tessel plugin exports tessel_status " +
                quoted_excerpt(symbol) + "(const tessel_host_api*, tessel_plugin_backend*, tessel_error*); see tessel/plugin/tessel_plugin.h)");
  check_entry_symbol(where, library->handle, entry, symbol);
  link_map* loaded = nullptr;
  if (dlinfo(library->handle, RTLD_DI_LINKMAP, &loaded) == 0 && loaded != nullptr) plugin_libraries().insert(loaded->l_name);

  // Aligned, zeroed room for the table; the host's struct is a prefix of it.
  alignas(std::max_align_t) static thread_local unsigned char reserve[kPluginTableReserve];
  std::memset(reserve, 0, sizeof reserve);
  auto* table = reinterpret_cast<tessel_plugin_backend*>(reserve);
  table->struct_size = static_cast<uint32_t>(kPluginTableReserve);
  tessel_error error{};
  int raw_status = TESSEL_ERROR_INTERNAL;
  try {
    raw_status = static_cast<int>(reinterpret_cast<tessel_plugin_init_fn>(entry)(host_api(), table, &error));
  } catch (...) {
    throw Error(where + ": the entry point threw an exception (plugins must return status codes)");
  }
  if (!is_known_status(raw_status))
    throw Error(detail::concat(where, ": entry symbol '", symbol, "' returned ", raw_status,
                               ", not a tessel_status: it is no tessel plugin entry point"));
  const auto status = static_cast<tessel_status>(raw_status);
  error.message[TESSEL_ERROR_MESSAGE_SIZE - 1] = '\0';  // whatever the plugin wrote, the host reads a string
  if (status != TESSEL_OK)
    throw Error(detail::concat(where, ": init failed (status ", status_name(status), "): ",
                               error.message[0] ? error.message : "no message"));
  const tessel_plugin_backend checked = checked_plugin_table(where, reserve);
  check_code_pointers(where, checked);
  library->table = checked;
  log_message(LogLevel::kDebug, "loaded " + library->describe());
  return std::make_shared<PluginBackend>(std::move(library));
}

}  // namespace tessel::plugin
