// memwarden's CPU allocation recorder.
//
// Why native: allocation truth on CPU must come from the allocator, and doing
// it per op in Python (a dispatch mode) costs more than the model itself on
// small models. Here the default CPU allocator is wrapped (c10::SetCPUAllocator)
// so that every allocate/free is appended to an in-memory event log for ~50 ns,
// and a global RecordFunction callback keeps the name of the aten op that is
// running so each allocation knows which op made it. Module attribution comes
// from Python forward hooks that push/pop a context id (enter/exit markers in
// the same log, on the same clock). Nothing here reads Python objects.
//
// The wrapper delegates to the allocator it replaced, so PyTorch's profiler
// still sees every allocation (its reportMemoryUsage runs inside the default
// allocator) and memwarden's numbers can be checked against it.

#include <torch/extension.h>

#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <map>
#include <chrono>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

enum : uint8_t { kAlloc = 0, kFree = 1, kEnter = 2, kExit = 3 };

struct Event {
  int64_t t_ns;
  int64_t ptr;
  int64_t nbytes;
  int64_t id;        // block id (alloc/free) or context id (enter/exit)
  int32_t ctx;       // innermost context when the event happened, -1 = none
  int32_t op_outer;  // interned name of the outermost running op on this thread, -1 = none
  int32_t op_inner;  // interned name of the innermost running op
  int32_t shape_off; // offset into g_shapes, -1 = unknown
  int16_t ndim;
  int8_t dtype;      // c10::ScalarType, -1 = unknown
  uint8_t action;
  int32_t site;      // interned user-code line (see intern_site), -1 = unknown
  int64_t written;   // bytes that ops wrote into the block (inputs of the op that made it, then
                     // sources of in-place writes such as copy_/index_put_); -1 = unknown
};

// The streamer (capture/live/stream.py) reads rows as raw bytes with this exact layout.
static_assert(sizeof(Event) == 64, "memwarden: Event layout changed; update stream.py's EVENT_DTYPE");
static_assert(offsetof(Event, site) == 52 && offsetof(Event, written) == 56, "memwarden: Event layout changed");

struct Live {
  int64_t id;
  int64_t nbytes;
  size_t event_index;
};

std::mutex g_mu;
std::atomic<bool> g_recording{false};
std::vector<Event> g_events;
std::vector<int64_t> g_shapes;
std::map<std::vector<int64_t>, int32_t> g_shape_offsets;  // shapes repeat: store each once in g_shapes
std::unordered_map<int64_t, Live> g_live;
std::vector<int32_t> g_ctx_stack;
std::unordered_map<std::string, int32_t> g_op_ids;
std::vector<std::string> g_op_names;
int64_t g_next_id = 1;
int64_t g_untracked_frees = 0;
c10::Allocator* g_inner = nullptr;
c10::DeleterFnPtr g_inner_deleter = nullptr;
c10::Allocator* g_previous = nullptr;
std::atomic<int64_t> g_unwrapped{0};
at::CallbackHandle g_callback = 0;

thread_local std::vector<const char*> t_ops;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Caller holds g_mu.
int32_t intern_op(const char* name) {
  if (name == nullptr) return -1;
  auto it = g_op_ids.find(name);
  if (it != g_op_ids.end()) return it->second;
  int32_t id = static_cast<int32_t>(g_op_names.size());
  g_op_names.emplace_back(name);
  g_op_ids.emplace(g_op_names.back(), id);
  return id;
}

// Caller holds g_mu.
void push_event(uint8_t action, int64_t ptr, int64_t nbytes, int64_t id) {
  Event e;
  e.t_ns = now_ns();
  e.ptr = ptr;
  e.nbytes = nbytes;
  e.id = id;
  e.ctx = g_ctx_stack.empty() ? -1 : g_ctx_stack.back();
  e.op_outer = t_ops.empty() ? -1 : intern_op(t_ops.front());
  e.op_inner = t_ops.empty() ? -1 : intern_op(t_ops.back());
  e.shape_off = -1;
  e.ndim = 0;
  e.dtype = -1;
  e.action = action;
  e.site = -1;
  e.written = -1;
  g_events.push_back(e);
}

void recording_delete(void* ptr) {
  if (g_recording.load(std::memory_order_relaxed) && ptr != nullptr) {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_live.find(reinterpret_cast<int64_t>(ptr));
    if (it != g_live.end()) {
      push_event(kFree, it->first, it->second.nbytes, it->second.id);
      g_live.erase(it);
    } else {
      ++g_untracked_frees;
    }
  }
  g_inner_deleter(ptr);
}

struct RecordingAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DataPtr inner = g_inner->allocate(nbytes);
    void* data = inner.get();
    // The default CPU allocator uses the data pointer as context and a plain
    // deleter; only then can the deleter be swapped without a wrapper object.
    if (data == nullptr) return inner;  // zero-byte tensors own no memory
    if (inner.get_context() != data || inner.get_deleter() != g_inner_deleter) {
      g_unwrapped.fetch_add(1, std::memory_order_relaxed);  // reported in the trace's metadata
      return inner;
    }
    inner.release_context();
    if (g_recording.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(g_mu);
      int64_t id = g_next_id++;
      g_live[reinterpret_cast<int64_t>(data)] = Live{id, static_cast<int64_t>(nbytes), g_events.size()};
      push_event(kAlloc, reinterpret_cast<int64_t>(data), static_cast<int64_t>(nbytes), id);
    }
    return c10::DataPtr(data, data, &recording_delete, inner.device());
  }
  c10::DeleterFnPtr raw_deleter() const override { return &recording_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    g_inner->copy_data(dest, src, count);
  }
};

RecordingAllocator g_recording_allocator;

// Bytes of data a tensor carries: an expanded view carries only its storage.
int64_t data_bytes(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return 0;
  int64_t view = static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
  int64_t storage = static_cast<int64_t>(t.storage().nbytes());
  return view < storage ? view : storage;
}

const void* storage_key(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.device().type() != c10::DeviceType::CPU) return nullptr;
  return t.storage().data();
}

// Caller holds g_mu. `inputs` are the op's tensor inputs, flattened.
void note_output(const at::Tensor& t, const std::vector<at::Tensor>& inputs) {
  const void* key = storage_key(t);
  if (key == nullptr) return;
  auto it = g_live.find(reinterpret_cast<int64_t>(key));
  if (it == g_live.end()) return;
  Event& e = g_events[it->second.event_index];
  int64_t sources = 0;  // data bytes of the other inputs (for the op that made the block)
  int64_t converted = 0;  // the same counted in the output's dtype (for writes into it)
  const int64_t out_item = static_cast<int64_t>(t.element_size());
  for (const auto& in : inputs) {
    if (!in.defined() || storage_key(in) == key) continue;  // backward passes undefined grads
    int64_t bytes = data_bytes(in);
    int64_t item = static_cast<int64_t>(in.element_size());
    sources += bytes;
    converted += item > 0 ? bytes / item * out_item : bytes;
  }
  if (e.dtype < 0) {  // first op to return this block: the one that made it
    e.dtype = static_cast<int8_t>(t.scalar_type());
    std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
    auto found = g_shape_offsets.find(sizes);
    if (found == g_shape_offsets.end()) {
      found = g_shape_offsets.emplace(sizes, static_cast<int32_t>(g_shapes.size())).first;
      g_shapes.insert(g_shapes.end(), sizes.begin(), sizes.end());
    }
    e.shape_off = found->second;
    e.ndim = static_cast<int16_t>(t.dim());
    e.written = sources;
  } else if (sources > 0) {  // an in-place or out= op writing into an existing block
    bool aliases_input = false;
    for (const auto& in : inputs) aliases_input |= storage_key(in) == key;
    // An fp16 source copied into an fp32 block fills all of it: count in the block's dtype.
    if (aliases_input) e.written = (e.written < 0 ? 0 : e.written) + converted;
  }
}

void flatten_tensors(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTensorList()) {
    for (const auto& t : v.toTensorList()) out.push_back(t);
  } else if (v.isList()) {
    for (const auto& x : v.toListRef()) if (x.isTensor()) out.push_back(x.toTensor());
  }
}

// Tensor inputs of the outermost running op on this thread; RecordFunction only
// exposes inputs in the start callback.
thread_local std::vector<at::Tensor> t_inputs;

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  const bool outermost = t_ops.empty();
  t_ops.push_back(fn.name());  // first: on_exit pops whatever happens below
  if (outermost) {
    t_inputs.clear();
    try {
      for (const auto& in : fn.inputs()) flatten_tensors(in, t_inputs);
      // new_zeros/new_empty/... and zeros_like/empty_like/... read only the shape and
      // dtype of their first input: it is a template, not data written into the result.
      std::string_view name(fn.name());
      bool templated = name.rfind("aten::new_", 0) == 0 ||
                       (name.size() > 5 && name.compare(name.size() - 5, 5, "_like") == 0);
      if (templated && !t_inputs.empty()) t_inputs.erase(t_inputs.begin());
    } catch (...) {
      t_inputs.clear();
    }
  }
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  // Pop first: whatever happens below, the op stack must stay in step with RecordFunction.
  const bool outermost = t_ops.size() == 1;
  if (!t_ops.empty()) t_ops.pop_back();
  if (!outermost || !g_recording.load(std::memory_order_relaxed)) return;
  try {
    std::vector<at::Tensor> inputs, outputs;
    inputs.swap(t_inputs);
    for (const auto& out : fn.outputs()) flatten_tensors(out, outputs);
    std::lock_guard<std::mutex> lock(g_mu);
    for (const auto& t : outputs) note_output(t, inputs);
  } catch (...) {
    // Metadata of one op is lost; the allocation log itself is unaffected.
  }
}

void start(bool record_ops) {
  std::lock_guard<std::mutex> lock(g_mu);
  TORCH_CHECK(!g_recording.load(), "memwarden: a capture is already running");
  g_events.clear();
  g_shapes.clear();
  g_shape_offsets.clear();
  g_live.clear();
  g_ctx_stack.clear();
  g_untracked_frees = 0;
  g_unwrapped = 0;
  g_previous = c10::GetCPUAllocator();
  if (g_previous != &g_recording_allocator) {
    g_inner = g_previous;
    g_inner_deleter = g_inner->raw_deleter();
    TORCH_CHECK(g_inner_deleter != nullptr, "memwarden: the CPU allocator has no raw deleter; cannot record");
    c10::SetCPUAllocator(&g_recording_allocator, /*priority=*/UINT8_MAX);
  }
  if (record_ops) {
    g_callback = at::addGlobalCallback(at::RecordFunctionCallback(&on_enter, &on_exit)
                                           .needsInputs(true)
                                           .needsOutputs(true)
                                           .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  }
  g_recording = true;
}

void stop() {
  g_recording = false;
  if (g_callback != 0) {
    at::removeCallback(g_callback);
    g_callback = 0;
  }
  // The wrapper stays installed as a pass-through: blocks allocated during the
  // capture still carry its deleter, and swapping allocators back and forth
  // while tensors are alive gains nothing.
}

void enter(int64_t ctx) {
  if (!g_recording.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mu);
  push_event(kEnter, 0, 0, ctx);
  g_ctx_stack.push_back(static_cast<int32_t>(ctx));
}

void exit_ctx(int64_t ctx) {
  if (!g_recording.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mu);
  // Pop through to the matching context, so a skipped exit never corrupts the stack.
  while (!g_ctx_stack.empty()) {
    int32_t top = g_ctx_stack.back();
    g_ctx_stack.pop_back();
    if (top == ctx) break;
  }
  push_event(kExit, 0, 0, ctx);
}

// Returns the columns as tensors (copies), the shape pool, the op names, and counters.
py::dict drain() {
  // Swap the log out under the lock, then build tensors without it: building
  // them allocates, and the allocator wrapper takes the same lock.
  std::vector<Event> events;
  std::vector<int64_t> shapes_pool;
  std::vector<std::string> op_names;
  int64_t untracked, live;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    events.swap(g_events);
    shapes_pool.swap(g_shapes);
    op_names = g_op_names;
    untracked = g_untracked_frees;
    live = static_cast<int64_t>(g_live.size());
  }
  const int64_t n = static_cast<int64_t>(events.size());
  auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  auto i32 = torch::TensorOptions().dtype(torch::kInt32);
  torch::Tensor t = torch::empty({n}, i64), ptr = torch::empty({n}, i64), nb = torch::empty({n}, i64),
                id = torch::empty({n}, i64);
  torch::Tensor ctx = torch::empty({n}, i32), opo = torch::empty({n}, i32), opi = torch::empty({n}, i32),
                soff = torch::empty({n}, i32);
  torch::Tensor ndim = torch::empty({n}, torch::TensorOptions().dtype(torch::kInt16));
  torch::Tensor dt = torch::empty({n}, torch::TensorOptions().dtype(torch::kInt8));
  torch::Tensor act = torch::empty({n}, torch::TensorOptions().dtype(torch::kUInt8));
  torch::Tensor wr = torch::empty({n}, i64);
  auto* pw = wr.data_ptr<int64_t>();
  auto* pt = t.data_ptr<int64_t>();
  auto* pp = ptr.data_ptr<int64_t>();
  auto* pn = nb.data_ptr<int64_t>();
  auto* pi = id.data_ptr<int64_t>();
  auto* pc = ctx.data_ptr<int32_t>();
  auto* po = opo.data_ptr<int32_t>();
  auto* pq = opi.data_ptr<int32_t>();
  auto* ps = soff.data_ptr<int32_t>();
  auto* pd = ndim.data_ptr<int16_t>();
  auto* pdt = dt.data_ptr<int8_t>();
  auto* pa = act.data_ptr<uint8_t>();
  for (int64_t k = 0; k < n; ++k) {
    const Event& e = events[k];
    pt[k] = e.t_ns; pp[k] = e.ptr; pn[k] = e.nbytes; pi[k] = e.id; pc[k] = e.ctx;
    po[k] = e.op_outer; pq[k] = e.op_inner; ps[k] = e.shape_off; pd[k] = e.ndim; pdt[k] = e.dtype; pa[k] = e.action; pw[k] = e.written;
  }
  torch::Tensor shapes = torch::empty({static_cast<int64_t>(shapes_pool.size())}, i64);
  if (!shapes_pool.empty()) {
    std::memcpy(shapes.data_ptr<int64_t>(), shapes_pool.data(), shapes_pool.size() * sizeof(int64_t));
  }
  py::dict out;
  out["time_ns"] = t; out["ptr"] = ptr; out["nbytes"] = nb; out["id"] = id; out["ctx"] = ctx;
  out["op_outer"] = opo; out["op_inner"] = opi; out["shape_off"] = soff; out["ndim"] = ndim;
  out["dtype"] = dt; out["action"] = act; out["shapes"] = shapes; out["written"] = wr;
  out["op_names"] = op_names;
  out["untracked_frees"] = untracked;
  out["unwrapped_allocations"] = g_unwrapped.load();
  out["live_at_drain"] = live;
  return out;
}

// Rows [ev_start, end), shape-pool entries [shape_start, end) and op names [op_start, end) logged
// so far, as raw bytes (Event rows, int64 dims) and strings, without clearing anything: the
// streamer's incremental read. Python bytes, not tensors: building tensors would allocate
// through the recording allocator and log the streamer's own memory.
py::tuple stream_since(int64_t ev_start, int64_t shape_start, int64_t op_start) {
  std::string rows, dims;
  std::vector<std::string> ops;
  int64_t ev_end, shape_end;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    ev_end = static_cast<int64_t>(g_events.size());
    shape_end = static_cast<int64_t>(g_shapes.size());
    if (ev_start < 0 || ev_start > ev_end) ev_start = ev_end;
    if (shape_start < 0 || shape_start > shape_end) shape_start = shape_end;
    rows.assign(reinterpret_cast<const char*>(g_events.data() + ev_start),
                static_cast<size_t>(ev_end - ev_start) * sizeof(Event));
    dims.assign(reinterpret_cast<const char*>(g_shapes.data() + shape_start),
                static_cast<size_t>(shape_end - shape_start) * sizeof(int64_t));
    for (size_t k = static_cast<size_t>(op_start < 0 ? 0 : op_start); k < g_op_names.size(); ++k) {
      ops.push_back(g_op_names[k]);
    }
  }
  return py::make_tuple(py::bytes(rows), ev_end, py::bytes(dims), shape_end, ops);
}

py::list scalar_type_names() {
  py::list names;
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    names.append(std::string(c10::toString(static_cast<c10::ScalarType>(i))));
  }
  return names;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "memwarden CPU allocation recorder";
  m.def("start", &start, py::arg("record_ops") = true);
  m.def("stop", &stop);
  m.def("enter", &enter);
  m.def("exit", &exit_ctx);
  m.def("drain", &drain);
  m.def("now_ns", &now_ns);
  m.def("stream_since", &stream_since);
  m.def("scalar_type_names", &scalar_type_names);
  m.def("recording", []() { return g_recording.load(); });
}
