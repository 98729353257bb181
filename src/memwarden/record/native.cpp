// memwarden's CPU allocation recorder.
//
// Why native: allocation truth on CPU must come from the allocator, and doing
// it per op in Python (a dispatch mode) costs more than the model itself on
// small models. Here the default CPU allocator is wrapped (c10::SetCPUAllocator)
// so that every allocate/free is appended to an in-memory event log for ~50 ns,
// and a global RecordFunction callback keeps the name of the aten op that is
// running so each allocation knows which op made it. Module attribution comes
// from Python forward hooks that push/pop a context id (enter/exit markers in
// the same log, on the same clock); the hooks of nested calls run here, in C++ (see
// module_pre), the rest in Python. Python objects are read by those hooks, by the source-line
// lookup and by the start-up scan of the collector's lists, each under the GIL.
//
// The wrapper delegates to the allocator it replaced, so PyTorch's profiler
// still sees every allocation (its reportMemoryUsage runs inside the default
// allocator) and memwarden's numbers can be checked against it.

#include <torch/extension.h>

// numpy's data-memory handler API (NumPy >= 1.22), compiled against the numpy installed beside
// torch: arrays' data made while a capture runs pass through numpy_malloc and friends below.
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>

#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <map>
#include <chrono>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cerrno>

// Source lines (see current_site): the running thread's Python frames are read in place, without
// the GIL. torch's bindings release the GIL during dispatch, and taking it back inside the
// allocator could deadlock against a thread that holds the GIL and waits on a lock held here.
// Reading is safe without it: only this thread pushes or pops its own frames, and it is busy
// in this very call; code objects on a live frame are alive, and their names and line tables are
// immutable. The frame layout is CPython's internal one, so this is compiled per minor version.
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define MEMWARDEN_FRAMES 1
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef _PyGC_FINALIZED  // the public objimpl.h defines it too; pycore_gc.h's is the same test
#include <internal/pycore_gc.h>
#undef Py_BUILD_CORE
#else
#define MEMWARDEN_FRAMES 0
#endif

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

// The streamer (record/live/stream.py) reads rows as raw bytes with this exact layout.
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
std::vector<uint8_t> g_fast_stack;  // beside g_ctx_stack: 1 = entered on the hooks' fast path
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

// -- the crash ring -------------------------------------------------------------------------------
// The streamer (record/live/stream.py) copies g_events to a file every 100 ms; a process that dies
// between two copies takes the rows since the last one with it. With a ring attached (ring_attach,
// ``memwarden trace``'s child), every row is also copied, as it is logged, into a file mapped
// MAP_SHARED: the kernel owns those pages, so they outlive the process however it dies (SIGKILL,
// SIGSEGV, SIGABRT, _exit) and the supervisor reads them after it (record/live/recover.py).
// Layout, little-endian (recover.py's RING_* constants mirror it):
//   [0, 4096)          header: magic "MWRING01", u32 version, u32 row bytes, u64 capacity (rows),
//                      u64 side capacity (bytes), u64 written (rows logged: the next row's
//                      sequence number), u64 side used (bytes), u64 side records dropped
//   seqs               capacity x u64: the sequence number of the row in each slot (~0: being written)
//   rows               capacity x Event: row `seq` lives in slot seq % capacity
//   side               append-only records the rows refer to that the stream may not have yet:
//                      u8 kind (1 op name, 2 site name, 3 shape), 3 pad, i32 id (op/site id, or
//                      offset in the shape pool), u32 payload bytes, payload (text, or i64 dims)
// A row's copy is updated in place while its slot still holds it (note_output fills in dtype,
// shape and written bytes when the op that made the block returns). The cost per row is one
// 64-byte copy into memory already mapped.
constexpr uint64_t kRingHeader = 4096;
constexpr uint64_t kNotWritten = ~0ULL;
struct RingHeader {
  char magic[8];
  uint32_t version;
  uint32_t row_bytes;
  uint64_t capacity;
  uint64_t side_capacity;
  uint64_t written;
  uint64_t side_used;
  uint64_t side_dropped;
};
RingHeader* g_ring = nullptr;  // nullptr: no ring attached
uint64_t* g_ring_seqs = nullptr;
Event* g_ring_rows = nullptr;
char* g_ring_side = nullptr;
size_t g_ring_map_bytes = 0;
// g_events[k] for k >= g_ring_split is ring row g_ring_base + (k - g_ring_split); rows before the
// split are older rows a flight-recorder cut kept (the live state), already streamed.
int64_t g_ring_split = 0;
int64_t g_ring_base = 0;

inline void ring_store_seq(uint64_t slot, uint64_t value) {
  __atomic_store_n(&g_ring_seqs[slot], value, __ATOMIC_RELEASE);
}

// Caller holds g_mu (or is single-threaded).
void ring_reset() {
  if (g_ring == nullptr) return;
  __atomic_store_n(&g_ring->written, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&g_ring->side_used, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&g_ring->side_dropped, 0, __ATOMIC_RELEASE);
  std::memset(g_ring_seqs, 0xff, g_ring->capacity * sizeof(uint64_t));
  g_ring_split = 0;
  g_ring_base = 0;
}

// Caller holds g_mu. The row just appended to g_events.
inline void ring_append(const Event& e) {
  if (g_ring == nullptr) return;
  const uint64_t seq = g_ring->written;
  const uint64_t slot = seq % g_ring->capacity;
  ring_store_seq(slot, kNotWritten);
  std::memcpy(&g_ring_rows[slot], &e, sizeof(Event));
  ring_store_seq(slot, seq);
  __atomic_store_n(&g_ring->written, seq + 1, __ATOMIC_RELEASE);
}

// Caller holds g_mu. g_events[k] changed: update its copy if the ring still holds it.
inline void ring_update(size_t k) {
  if (g_ring == nullptr || static_cast<int64_t>(k) < g_ring_split) return;
  const uint64_t seq = static_cast<uint64_t>(g_ring_base + (static_cast<int64_t>(k) - g_ring_split));
  const uint64_t slot = seq % g_ring->capacity;
  if (g_ring_seqs[slot] != seq) return;
  ring_store_seq(slot, kNotWritten);
  std::memcpy(&g_ring_rows[slot], &g_events[k], sizeof(Event));
  ring_store_seq(slot, seq);
}

// Caller holds g_mu. A record the rows refer to (see the layout above); dropped, and counted, when
// the side area is full (recovery then leaves those rows' op, site or shape unknown).
void ring_side(uint8_t kind, int32_t id, const void* payload, uint32_t nbytes) {
  if (g_ring == nullptr) return;
  const uint64_t used = g_ring->side_used;
  const uint64_t need = 12 + static_cast<uint64_t>(nbytes);
  if (used + need > g_ring->side_capacity) {
    __atomic_store_n(&g_ring->side_dropped, g_ring->side_dropped + 1, __ATOMIC_RELEASE);
    return;
  }
  char* at = g_ring_side + used;
  const uint8_t head[4] = {kind, 0, 0, 0};
  std::memcpy(at, head, 4);
  std::memcpy(at + 4, &id, 4);
  std::memcpy(at + 8, &nbytes, 4);
  if (nbytes) std::memcpy(at + 12, payload, nbytes);
  __atomic_store_n(&g_ring->side_used, used + need, __ATOMIC_RELEASE);  // the record is whole first
}

void ring_detach_locked() {
  if (g_ring == nullptr) return;
  munmap(g_ring, g_ring_map_bytes);
  g_ring = nullptr;
  g_ring_seqs = nullptr;
  g_ring_rows = nullptr;
  g_ring_side = nullptr;
  g_ring_map_bytes = 0;
}

// Map `path` (created or truncated to size) as the ring; capture start() empties it.
void ring_attach(const std::string& path, int64_t capacity, int64_t side_capacity) {
  TORCH_CHECK(capacity > 0 && side_capacity >= 0, "memwarden: ring capacity must be positive");
  std::lock_guard<std::mutex> lock(g_mu);
  ring_detach_locked();
  const uint64_t cap = static_cast<uint64_t>(capacity);
  const uint64_t side = static_cast<uint64_t>(side_capacity);
  const size_t bytes = kRingHeader + cap * (sizeof(uint64_t) + sizeof(Event)) + side;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  TORCH_CHECK(fd >= 0, "memwarden: cannot open the ring file ", path, ": ", std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    TORCH_CHECK(false, "memwarden: cannot size the ring file ", path, ": ", std::strerror(err));
  }
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the file
  TORCH_CHECK(map != MAP_FAILED, "memwarden: cannot map the ring file ", path, ": ", std::strerror(errno));
  g_ring_map_bytes = bytes;
  g_ring = static_cast<RingHeader*>(map);
  g_ring_seqs = reinterpret_cast<uint64_t*>(static_cast<char*>(map) + kRingHeader);
  g_ring_rows = reinterpret_cast<Event*>(static_cast<char*>(map) + kRingHeader + cap * sizeof(uint64_t));
  g_ring_side = static_cast<char*>(map) + kRingHeader + cap * (sizeof(uint64_t) + sizeof(Event));
  std::memcpy(g_ring->magic, "MWRING01", 8);
  g_ring->version = 1;
  g_ring->row_bytes = sizeof(Event);
  g_ring->capacity = cap;
  g_ring->side_capacity = side;
  ring_reset();
}

void ring_detach() {
  std::lock_guard<std::mutex> lock(g_mu);
  ring_detach_locked();
}

// (split, base): where g_events meets the ring's sequence numbers now (the streamer writes it into
// each stream's start chunk), or None without a ring.
py::object ring_origin() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_ring == nullptr) return py::none();
  return py::make_tuple(g_ring_split, g_ring_base, static_cast<int64_t>(g_ring->capacity));
}

// -- source lines -------------------------------------------------------------------------------
// A site is a Python stack, innermost frame first, one "file:line:function" per line, the
// innermost frame of the user's code marked with a leading '*'. Without stacks a site is that
// one frame. Code objects are classified (user or library) once, by path prefix.
bool g_sites = false;
bool g_stacks = false;
std::vector<std::string> g_user_prefixes, g_library_prefixes;
struct CodeInfo {
  const void* filename;  // the code's co_filename and co_qualname objects and first line: a code
  const void* name;      // object freed and its address reused by another fails this check
  int firstlineno;
  bool user;
  uint32_t index;  // into g_code_names
};
std::unordered_map<const void*, CodeInfo> g_codes;
std::vector<std::pair<std::string, std::string>> g_code_names;  // (file, function)
std::unordered_map<uint64_t, int32_t> g_site_ids;  // (code index, line) -> site, without stacks
std::map<std::vector<uint64_t>, int32_t> g_stack_ids;  // frames -> site, with stacks
std::vector<std::string> g_site_names;

#if MEMWARDEN_FRAMES
std::string utf8_of(PyObject* text) {
  std::string out;
  if (text == nullptr || !PyUnicode_Check(text) || !PyUnicode_IS_READY(text)) return "?";
  const int kind = PyUnicode_KIND(text);
  const void* data = PyUnicode_DATA(text);
  const Py_ssize_t n = PyUnicode_GET_LENGTH(text);
  for (Py_ssize_t i = 0; i < n; ++i) {  // by hand: PyUnicode_AsUTF8 may allocate, needing the GIL
    uint32_t c = PyUnicode_READ(kind, data, i);
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

bool is_user_file(const std::string& file) {
  for (const auto& p : g_user_prefixes) if (starts_with(file, p)) return true;
  for (const auto& p : g_library_prefixes) if (starts_with(file, p)) return false;
  return !starts_with(file, "<frozen ");
}

// Caller holds g_mu.
const CodeInfo& code_info(PyCodeObject* code) {
  auto it = g_codes.find(code);
  if (it != g_codes.end() && it->second.filename == code->co_filename && it->second.name == code->co_qualname &&
      it->second.firstlineno == code->co_firstlineno) {
    return it->second;
  }
  std::string file = utf8_of(code->co_filename);
  CodeInfo info{code->co_filename, code->co_qualname, code->co_firstlineno, is_user_file(file),
                static_cast<uint32_t>(g_code_names.size())};
  g_code_names.emplace_back(std::move(file), utf8_of(code->co_qualname));
  return g_codes[code] = info;
}

std::string frame_text(uint64_t key) {
  const auto& names = g_code_names[key >> 32];
  return names.first + ":" + std::to_string(static_cast<uint32_t>(key)) + ":" + names.second;
}

// Caller holds g_mu. The site of an allocation made now on this thread, -1 = none (a thread
// without Python, such as an intra-op worker, or no frame of the user's code without stacks).
int32_t current_site() {
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr || ts->cframe == nullptr) return -1;
  std::vector<uint64_t> frames;
  int user = -1;
  int depth = 0;
  for (_PyInterpreterFrame* f = ts->cframe->current_frame; f != nullptr && depth < 128; f = f->previous, ++depth) {
    if (_PyFrame_IsIncomplete(f)) continue;
    PyCodeObject* code = f->f_code;
    const CodeInfo& info = code_info(code);
    if (!g_stacks && !info.user) continue;  // the line table is read for the frames kept only
    int line = PyCode_Addr2Line(code, _PyInterpreterFrame_LASTI(f) * static_cast<int>(sizeof(_Py_CODEUNIT)));
    uint64_t key = (static_cast<uint64_t>(info.index) << 32) | static_cast<uint32_t>(line < 0 ? 0 : line);
    if (!g_stacks) {
      auto found = g_site_ids.find(key);
      if (found != g_site_ids.end()) return found->second;
      int32_t id = static_cast<int32_t>(g_site_names.size());
      g_site_names.push_back("*" + frame_text(key));
      ring_side(2, id, g_site_names.back().data(), static_cast<uint32_t>(g_site_names.back().size()));
      g_site_ids.emplace(key, id);
      return id;
    }
    if (info.user && user < 0) user = static_cast<int>(frames.size());
    frames.push_back(key);
  }
  if (frames.empty()) return -1;
  frames.push_back(static_cast<uint64_t>(user));  // the mark is part of the key
  auto found = g_stack_ids.find(frames);
  if (found != g_stack_ids.end()) return found->second;
  std::string text;
  for (size_t k = 0; k + 1 < frames.size(); ++k) {
    if (k) text += "\n";
    if (static_cast<int>(k) == user) text += "*";
    text += frame_text(frames[k]);
  }
  int32_t id = static_cast<int32_t>(g_site_names.size());
  g_site_names.push_back(std::move(text));
  ring_side(2, id, g_site_names.back().data(), static_cast<uint32_t>(g_site_names.back().size()));
  g_stack_ids.emplace(std::move(frames), id);
  return id;
}
#else
int32_t current_site() { return -1; }
#endif

#if MEMWARDEN_FRAMES
// The old generation holds nearly every object (~4x10^5 in a transformers process), and a walk
// through a linked list waits on one cache miss per object. It is walked as ~16 chains at once
// instead, each prefetching its next node while the others work, each starting from an anchor: a
// module-level function (no closure: it keeps nothing alive but its module's globals, which its
// module holds anyway) kept from the previous walk, spaced along the list. The anchors and the
// list's head cut the list into segments whatever order a collection left them in, so each
// object is visited once. An anchor that gc.freeze() moved to the permanent generation ends its
// chain at that generation's head: the chain is dropped (gc.get_objects() leaves the permanent
// generation out too). Anchors are picked again on every walk, evenly spaced by position; the
// first walk of a process has none and walks the list from both ends (two chains).
constexpr int kOldChains = 16;
std::vector<PyObject*> g_anchors;  // owned references

template <typename Keep>
void walk_old_generation(struct _gc_runtime_state* state, Keep& keep, std::vector<PyObject*>& found) {
  PyGC_Head* head = &state->generations[NUM_GENERATIONS - 1].head;
  PyGC_Head* permanent = &state->permanent_generation.head;
  struct Chain {
    PyGC_Head* node;
    PyGC_Head* start = node;
    bool done = false;
    bool in_old = true;
    Py_ssize_t visited = 0;
    std::vector<PyObject*> found;
    std::vector<std::pair<Py_ssize_t, PyObject*>> candidates;  // (index in the chain, function)
    Py_ssize_t next_candidate = 0;  // at most one candidate per kCandidateEvery nodes
    PyGC_Head* end = nullptr;  // the list head or the anchor the chain ran into
  };
  constexpr Py_ssize_t kCandidateEvery = 512;
  auto candidate = [](PyGC_Head* g) -> PyObject* {
    PyObject* op = reinterpret_cast<PyObject*>(g + 1);
    bool plain = PyFunction_Check(op) && reinterpret_cast<PyFunctionObject*>(op)->func_closure == nullptr;
    return plain ? op : nullptr;
  };
  auto note_candidate = [&](PyGC_Head* g, Chain& c) {
    if (c.visited++ < c.next_candidate) return;
    if (PyObject* f = candidate(g)) {
      c.candidates.emplace_back(c.visited - 1, f);
      c.next_candidate = c.visited - 1 + kCandidateEvery;
    }
  };
  std::vector<Chain> chains;
  std::unordered_set<PyGC_Head*> anchors;
  for (PyObject* a : g_anchors) {
    if (_PyObject_GC_IS_TRACKED(a)) anchors.insert(_Py_AS_GC(a));
  }
  if (anchors.empty()) {  // from both ends, as the young generations: chain 0 forward, chain 1 back
    chains.resize(2, Chain{nullptr});
    PyGC_Head* front = _PyGCHead_NEXT(head);
    PyGC_Head* back = _PyGCHead_PREV(head);
    auto visit = [&](PyGC_Head* g, Chain& c) {
      keep(g, c.found);
      note_candidate(g, c);
    };
    while (front != head && back != head) {
      if (front == back) {
        visit(front, chains[0]);
        break;
      }
      visit(front, chains[0]);
      PyGC_Head* next = _PyGCHead_NEXT(front);
      if (next == back) {
        visit(back, chains[1]);
        break;
      }
      visit(back, chains[1]);
      front = next;
      back = _PyGCHead_PREV(back);
    }
    // Chain 1 ran backwards: put it in list order, so the two read as one chain.
    std::reverse(chains[1].found.begin(), chains[1].found.end());
    for (auto& [index, f] : chains[1].candidates) index = chains[1].visited - 1 - index;
    std::reverse(chains[1].candidates.begin(), chains[1].candidates.end());
  } else {
    PyGC_Head* first = _PyGCHead_NEXT(head);
    if (first != head && !anchors.count(first)) chains.push_back(Chain{first});
    for (PyGC_Head* a : anchors) chains.push_back(Chain{a});
    size_t active = chains.size();
    while (active > 0) {
      for (Chain& c : chains) {  // one node of every chain in turn: their cache misses overlap
        if (c.done) continue;
        // Another chain's anchor ends this one (anchors are functions: test the type first).
        if (c.visited > 0 && Py_IS_TYPE(reinterpret_cast<PyObject*>(c.node + 1), &PyFunction_Type) &&
            anchors.count(c.node)) {
          c.done = true;
          c.end = c.node;
          --active;
          continue;
        }
        keep(c.node, c.found);
        note_candidate(c.node, c);
        PyGC_Head* next = _PyGCHead_NEXT(c.node);
        if (next == head || next == permanent) {
          c.done = true;
          c.end = next;
          --active;
        } else {
          __builtin_prefetch(next);
          c.node = next;
        }
      }
    }
    // A chain that ran into an anchor lies in the list that anchor's chain ends in: follow the
    // anchors to a head (every list ends at its head, so this ends). gc.freeze() moved them all?
    // Then their chains lie in the permanent generation, which is not walked.
    std::unordered_map<PyGC_Head*, const Chain*> chain_from;
    for (const Chain& c : chains) chain_from.emplace(c.start, &c);
    for (Chain& c : chains) {
      const Chain* at = &c;
      for (size_t hops = 0; hops <= chains.size() && at->end != head && at->end != permanent; ++hops) {
        auto it = chain_from.find(at->end);
        if (it == chain_from.end()) break;
        at = it->second;
      }
      c.in_old = at->end == head;
    }
  }
  // Keep what the old generation's chains found; pick the next walk's anchors along them.
  Py_ssize_t total = 0;
  for (const Chain& c : chains) total += c.in_old ? c.visited : 0;
  const Py_ssize_t spacing = total / kOldChains;
  std::vector<PyObject*> picked;
  Py_ssize_t offset = 0, want = spacing;
  for (Chain& c : chains) {
    if (!c.in_old) {
      for (PyObject* op : c.found) Py_DECREF(op);
      continue;
    }
    found.insert(found.end(), c.found.begin(), c.found.end());
    for (const auto& [index, f] : c.candidates) {
      if (spacing < 1024 || offset + index < want) continue;  // a short list needs no anchors
      Py_INCREF(f);
      picked.push_back(f);
      want = offset + index + spacing;
    }
    offset += c.visited;
  }
  for (PyObject* a : g_anchors) Py_DECREF(a);
  g_anchors.swap(picked);
}
#endif

// The capture's start-up scan: every object the garbage collector tracks whose type derives from
// one of `bases` (tensors, modules), in gc.get_objects() order, or None where this interpreter's
// layout cannot be confirmed (the caller then filters gc.get_objects() itself). Walking the
// generations here costs a pointer chase per object; gc.get_objects() builds a list of every
// object of the process (~4x10^5 in a transformers process) that Python then filters, which cost
// more than a tiny model's whole generate(). Runs with the GIL held (pybind11 takes it), so no
// other thread moves objects between generations meanwhile.
py::object gc_instances(const py::tuple& bases) {
#if MEMWARDEN_FRAMES
  std::vector<PyTypeObject*> types;
  for (const auto& b : bases) {
    if (!PyType_Check(b.ptr())) throw py::type_error("gc_instances: bases must be types");
    types.push_back(reinterpret_cast<PyTypeObject*>(b.ptr()));
  }
  // A new container is tracked at the young end of generation 0, so the node after it is that
  // generation's list head, which lies inside the collector's state: confirm the layout by the
  // state's own pointer to generation 0 before reading anything else through it.
  PyObject* probe = PyList_New(0);
  if (probe == nullptr) throw py::error_already_set();
  PyGC_Head* head0 = _PyGCHead_NEXT(_Py_AS_GC(probe));
  auto* state = reinterpret_cast<struct _gc_runtime_state*>(reinterpret_cast<char*>(head0) -
                                                             offsetof(struct _gc_runtime_state, generations));
  if (state->generation0 != head0 || state->collecting || _PyGCHead_PREV(head0) != _Py_AS_GC(probe)) {
    Py_DECREF(probe);
    return py::none();
  }
  std::vector<PyObject*> found, from_back;
  // Whether a type derives from one of `types`, remembered per type for this walk (a few thousand
  // types against ~10^5 objects; a type cannot be freed while the walk runs, nothing runs Python).
  struct TypeSlot {
    PyTypeObject* type = nullptr;
    bool wanted = false;
  };
  std::vector<TypeSlot> type_cache(4096);
  auto wanted = [&](PyTypeObject* type) {
    TypeSlot& slot = type_cache[(reinterpret_cast<uintptr_t>(type) >> 4) & 4095];
    if (slot.type != type) {
      slot.type = type;
      slot.wanted = false;
      for (PyTypeObject* base : types) slot.wanted = slot.wanted || PyType_IsSubtype(type, base);
    }
    return slot.wanted;
  };
  auto keep = [&](PyGC_Head* g, std::vector<PyObject*>& into) {
    PyObject* op = reinterpret_cast<PyObject*>(g + 1);
    if (op == probe || !wanted(Py_TYPE(op))) return;
    Py_INCREF(op);  // kept alive if building the list below runs a collection
    into.push_back(op);
  };
  // The young generations (small) are walked from both ends at once, meeting in the middle: the
  // walk waits on one cache miss per object, and two independent chains let the CPU wait on two.
  for (int i = 0; i < NUM_GENERATIONS - 1; ++i) {
    PyGC_Head* head = &state->generations[i].head;
    PyGC_Head* front = _PyGCHead_NEXT(head);
    PyGC_Head* back = _PyGCHead_PREV(head);
    from_back.clear();
    // Invariant: the nodes strictly between `front` and `back` (and both, unless they crossed)
    // are still to visit; a list of n nodes ends after n visits, whatever its parity.
    while (front != head && back != head) {
      if (front == back) {
        keep(front, found);
        break;
      }
      keep(front, found);
      PyGC_Head* next = _PyGCHead_NEXT(front);
      if (next == back) {
        keep(back, from_back);
        break;
      }
      keep(back, from_back);
      front = next;
      back = _PyGCHead_PREV(back);
    }
    found.insert(found.end(), from_back.rbegin(), from_back.rend());
  }
  walk_old_generation(state, keep, found);
  Py_DECREF(probe);
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(found.size()));
  if (out == nullptr) {
    for (PyObject* op : found) Py_DECREF(op);
    throw py::error_already_set();
  }
  for (size_t k = 0; k < found.size(); ++k) PyList_SET_ITEM(out, static_cast<Py_ssize_t>(k), found[k]);
  return py::reinterpret_steal<py::object>(out);
#else
  (void)bases;
  return py::none();
#endif
}

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
  ring_side(1, id, g_op_names.back().data(), static_cast<uint32_t>(g_op_names.back().size()));
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
  e.site = (action == kAlloc && g_sites) ? current_site() : -1;
  e.written = -1;
  g_events.push_back(e);
  ring_append(e);
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

// -- numpy's data allocations -------------------------------------------------------------------
// Decoded video frames, a processor's pixel buffers and audio waveforms live in numpy arrays, whose
// data numpy allocates itself: invisible to the CPU allocator wrapper above. While a capture runs
// this module is numpy's data-memory handler (PyDataMem_SetHandler, a context variable: the
// capturing thread's arrays, not those of threads started elsewhere). Every call goes through to
// the handler it replaced (numpy's default keeps its small-block cache); blocks of at least
// g_np_min bytes are logged as ALLOC/FREE rows like a tensor's, their op named "(numpy)".
// An array made during the capture keeps this handler for its free, so the functions stay valid
// after the capture (they only pass through then).
PyDataMem_Handler* g_np_inner = nullptr;  // the handler replaced (numpy's default: static, never freed)
PyObject* g_np_previous = nullptr;        // its capsule, restored at numpy_stop (owned)
size_t g_np_min = 4096;
constexpr const char* kNumpyOp = "(numpy)";

void np_note_alloc(void* p, size_t size) {
  if (p == nullptr || size < g_np_min || !g_recording.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mu);
  int64_t id = g_next_id++;
  g_live[reinterpret_cast<int64_t>(p)] = Live{id, static_cast<int64_t>(size), g_events.size()};
  push_event(kAlloc, reinterpret_cast<int64_t>(p), static_cast<int64_t>(size), id);
  g_events.back().op_outer = g_events.back().op_inner = intern_op(kNumpyOp);
  ring_update(g_events.size() - 1);
}

void np_note_free(void* p) {
  if (p == nullptr || !g_recording.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_live.find(reinterpret_cast<int64_t>(p));
  if (it == g_live.end()) return;  // below g_np_min, or made before the capture
  push_event(kFree, it->first, it->second.nbytes, it->second.id);
  g_live.erase(it);
}

void* np_malloc(void*, size_t size) {
  void* p = g_np_inner->allocator.malloc(g_np_inner->allocator.ctx, size);
  np_note_alloc(p, size);
  return p;
}

void* np_calloc(void*, size_t nelem, size_t elsize) {
  void* p = g_np_inner->allocator.calloc(g_np_inner->allocator.ctx, nelem, elsize);
  np_note_alloc(p, nelem * elsize);
  return p;
}

void* np_realloc(void*, void* ptr, size_t size) {
  void* p = g_np_inner->allocator.realloc(g_np_inner->allocator.ctx, ptr, size);
  if (p != nullptr) {  // on failure the old block stays valid
    np_note_free(ptr);
    np_note_alloc(p, size);
  }
  return p;
}

void np_free(void*, void* ptr, size_t size) {
  np_note_free(ptr);
  g_np_inner->allocator.free(g_np_inner->allocator.ctx, ptr, size);
}

PyDataMem_Handler g_np_handler = {"memwarden", 1, {nullptr, np_malloc, np_calloc, np_realloc, np_free}};

// Install the handler on this thread's context; false where numpy's C API cannot be imported.
bool numpy_start(int64_t min_bytes) {
  if (g_np_previous != nullptr) return true;
  if (_import_array() < 0) {
    PyErr_Clear();
    return false;
  }
  PyObject* capsule = PyCapsule_New(&g_np_handler, "mem_handler", nullptr);
  if (capsule == nullptr) throw py::error_already_set();
  PyObject* previous = PyDataMem_SetHandler(capsule);
  Py_DECREF(capsule);  // the context variable holds it now
  if (previous == nullptr) throw py::error_already_set();
  auto* inner = static_cast<PyDataMem_Handler*>(PyCapsule_GetPointer(previous, "mem_handler"));
  if (inner == nullptr || inner == &g_np_handler) {
    PyErr_Clear();
    Py_XDECREF(PyDataMem_SetHandler(previous));
    Py_DECREF(previous);
    return false;
  }
  g_np_inner = inner;
  g_np_previous = previous;
  g_np_min = static_cast<size_t>(min_bytes < 1 ? 1 : min_bytes);
  return true;
}

void numpy_stop() {
  if (g_np_previous == nullptr) return;
  PyObject* ours = PyDataMem_SetHandler(g_np_previous);
  Py_XDECREF(ours);
  // g_np_previous stays referenced (and g_np_inner valid): arrays made during the capture free
  // through np_free, which calls it.
  g_np_previous = nullptr;
}

// Whether a block at this address is being recorded (a numpy array's data that torch.from_numpy
// wraps is already in the log: not a foreign storage too).
bool recorded(int64_t ptr) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_live.find(ptr) != g_live.end();
}

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
      ring_side(3, found->second, sizes.data(), static_cast<uint32_t>(sizes.size() * sizeof(int64_t)));
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
  ring_update(it->second.event_index);
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
  g_fast_stack.clear();
  g_untracked_frees = 0;
  g_unwrapped = 0;
  ring_reset();
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

// Which code is the user's: paths under a user prefix are, then paths under a library prefix are
// not, then everything else is (but frozen modules). Called before start().
void configure_sites(bool enabled, bool stacks, std::vector<std::string> user, std::vector<std::string> library) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_sites = enabled && MEMWARDEN_FRAMES;
  g_stacks = stacks;
  g_user_prefixes = std::move(user);
  g_library_prefixes = std::move(library);
  g_codes.clear();  // classification depends on the prefixes
  g_code_names.clear();
  g_site_ids.clear();
  g_stack_ids.clear();
  g_site_names.clear();
}

std::vector<std::string> site_names_since(int64_t start) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<std::string> out;
  for (size_t k = static_cast<size_t>(start < 0 ? 0 : start); k < g_site_names.size(); ++k) out.push_back(g_site_names[k]);
  return out;
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
  g_fast_stack.push_back(0);
}

void exit_ctx(int64_t ctx) {
  if (!g_recording.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mu);
  // Pop through to the matching context, so a skipped exit never corrupts the stack.
  while (!g_ctx_stack.empty()) {
    int32_t top = g_ctx_stack.back();
    g_ctx_stack.pop_back();
    g_fast_stack.pop_back();
    if (top == ctx) break;
  }
  push_event(kExit, 0, 0, ctx);
}

// -- module hooks' fast path ------------------------------------------------------------------
// Most module calls are nested calls of modules that are no boundary (a Linear inside a decoder
// layer): all their Python hooks did was push and pop a context, ~10 us a call. module_pre and
// module_post are the capture's global forward hooks: a module registered with fast_register and
// called inside another call is handled here (its ENTER row carries kFastEnter in its nbytes
// column: it has no input fingerprint); every other call goes to the Python hooks set with
// set_slow_hooks. All of this runs under the GIL, as module hooks do.
constexpr int64_t kFastEnter = -1;
struct FastModule {
  int32_t ctx;
  PyObject* ref;  // a weak reference to the module (owned): an address reused by a new module fails
};
std::unordered_map<PyObject*, FastModule> g_fast;
PyObject* g_slow_pre = nullptr;  // owned references; never released at interpreter exit
PyObject* g_slow_post = nullptr;

void fast_register(py::handle module, int64_t ctx) {
  PyObject* ref = PyWeakref_NewRef(module.ptr(), nullptr);
  if (ref == nullptr) throw py::error_already_set();
  auto [it, inserted] = g_fast.try_emplace(module.ptr(), FastModule{static_cast<int32_t>(ctx), ref});
  if (!inserted) {
    Py_DECREF(it->second.ref);
    it->second = FastModule{static_cast<int32_t>(ctx), ref};
  }
}

void fast_clear() {
  for (auto& entry : g_fast) Py_DECREF(entry.second.ref);
  g_fast.clear();
}

void set_slow_hooks(py::object pre, py::object post) {
  PyObject* old_pre = g_slow_pre;
  PyObject* old_post = g_slow_post;
  g_slow_pre = pre.is_none() ? nullptr : pre.release().ptr();
  g_slow_post = post.is_none() ? nullptr : post.release().ptr();
  Py_XDECREF(old_pre);
  Py_XDECREF(old_post);
}

// The context of a registered module, -1 if it is not one (or its address now holds another).
int32_t fast_ctx(PyObject* module) {
  if (!g_recording.load(std::memory_order_relaxed)) return -1;
  auto it = g_fast.find(module);
  if (it == g_fast.end() || PyWeakref_GetObject(it->second.ref) != module) return -1;
  return it->second.ctx;
}

py::object call_slow(PyObject* hook, std::initializer_list<PyObject*> args) {
  if (hook == nullptr) return py::none();
  py::tuple packed(args.size());
  size_t k = 0;
  for (PyObject* a : args) packed[k++] = py::reinterpret_borrow<py::object>(a);
  PyObject* result = PyObject_Call(hook, packed.ptr(), nullptr);
  if (result == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}

py::object module_pre(py::handle module, py::handle args) {
  const int32_t ctx = fast_ctx(module.ptr());
  if (ctx >= 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_ctx_stack.empty()) {  // a call from outside every module is a step or an input: Python's
      push_event(kEnter, 0, kFastEnter, ctx);
      g_ctx_stack.push_back(ctx);
      g_fast_stack.push_back(1);
      return py::none();
    }
  }
  return call_slow(g_slow_pre, {module.ptr(), args.ptr()});
}

py::object module_post(py::handle module, py::handle args, py::handle output) {
  const int32_t ctx = fast_ctx(module.ptr());
  if (ctx >= 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_ctx_stack.empty() && g_ctx_stack.back() == ctx && g_fast_stack.back() == 1) {
      g_ctx_stack.pop_back();
      g_fast_stack.pop_back();
      push_event(kExit, 0, 0, ctx);
      return py::none();
    }
  }
  return call_slow(g_slow_post, {module.ptr(), args.ptr(), output.ptr()});
}

// Returns the columns as tensors (copies), the shape pool, the op names, and counters.
py::dict drain() {
  // Swap the log out under the lock, then build tensors without it: building
  // them allocates, and the allocator wrapper takes the same lock.
  std::vector<Event> events;
  std::vector<int64_t> shapes_pool;
  std::vector<std::string> op_names, site_names;
  int64_t untracked, live;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    events.swap(g_events);
    shapes_pool.swap(g_shapes);
    if (g_ring != nullptr) {  // g_events starts over: its next row is the ring's next
      g_ring_split = 0;
      g_ring_base = static_cast<int64_t>(g_ring->written);
    }
    op_names = g_op_names;
    site_names = g_site_names;
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
  torch::Tensor site = torch::empty({n}, i32);
  auto* psite = site.data_ptr<int32_t>();
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
    psite[k] = e.site;
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
  out["site"] = site;
  out["site_names"] = site_names;
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

// The flight recorder's bound: forget what happened before `cutoff_ns` but the allocation rows of
// blocks alive at it (weights, caches: the state at the start of the window), whether they are
// still alive or freed inside the window. Rows from the cutoff on stay as they are. Returns (rows
// dropped, ENTER rows dropped that had an input fingerprint): the Python side drops as many
// fingerprints, which pair with those ENTER rows in order.
py::tuple compact(int64_t cutoff_ns) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<Event> kept;
  kept.reserve(g_live.size() + 1024);
  int64_t enters = 0;  // those with an input fingerprint: all but the fast path's
  int64_t first_recent = -1;  // index of the first row kept for its time (rows are in time order)
  // Blocks alive at the cutoff: alive now, or freed after it (their FREE rows are in the window).
  std::unordered_set<int64_t> freed_in_window;
  for (auto it = g_events.rbegin(); it != g_events.rend() && it->t_ns >= cutoff_ns; ++it) {
    if (it->action == kFree) freed_in_window.insert(it->id);
  }
  for (size_t k = 0; k < g_events.size(); ++k) {
    const Event& e = g_events[k];
    bool keep = e.t_ns >= cutoff_ns;
    if (keep && first_recent < 0) first_recent = static_cast<int64_t>(k);
    if (!keep && e.action == kAlloc) {
      auto it = g_live.find(e.ptr);
      keep = (it != g_live.end() && it->second.id == e.id) || freed_in_window.count(e.id) > 0;
    }
    if (keep) {
      kept.push_back(e);
    } else if (e.action == kEnter && e.nbytes != kFastEnter) {
      ++enters;
    }
  }
  if (g_ring != nullptr) {  // the rows from first_recent on keep their ring numbers, after the live state
    const int64_t recent = first_recent < 0 ? 0 : static_cast<int64_t>(g_events.size()) - first_recent;
    const int64_t split = static_cast<int64_t>(kept.size()) - recent;
    g_ring_base = first_recent < 0 || first_recent < g_ring_split ? static_cast<int64_t>(g_ring->written)
                                                                   : g_ring_base + (first_recent - g_ring_split);
    g_ring_split = first_recent < 0 || first_recent < g_ring_split ? static_cast<int64_t>(kept.size()) : split;
  }
  const int64_t dropped = static_cast<int64_t>(g_events.size() - kept.size());
  g_events.swap(kept);
  std::vector<Event>().swap(kept);  // give the old log's memory back now
  for (size_t k = 0; k < g_events.size(); ++k) {
    const Event& e = g_events[k];
    if (e.action != kAlloc) continue;
    auto it = g_live.find(e.ptr);
    if (it != g_live.end() && it->second.id == e.id) it->second.event_index = k;
  }
  return py::make_tuple(dropped, enters);
}

// The log's own memory in bytes (rows, shape pool, live-block table): what the ring bounds.
int64_t log_bytes() {
  std::lock_guard<std::mutex> lock(g_mu);
  return static_cast<int64_t>(g_events.capacity() * sizeof(Event) + g_shapes.capacity() * sizeof(int64_t) +
                              g_live.size() * (sizeof(Live) + sizeof(int64_t) + 16));
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
  m.def("numpy_start", &numpy_start, py::arg("min_bytes") = 4096);
  m.def("numpy_stop", &numpy_stop);
  m.def("recorded", &recorded);
  m.def("enter", &enter);
  m.def("exit", &exit_ctx);
  m.def("fast_register", &fast_register);
  m.def("fast_clear", &fast_clear);
  m.def("set_slow_hooks", &set_slow_hooks);
  m.def("module_pre", &module_pre);
  m.def("module_post", &module_post);
  m.def("drain", &drain);
  m.def("now_ns", &now_ns);
  m.def("stream_since", &stream_since);
  m.def("configure_sites", &configure_sites);
  m.def("compact", &compact);
  m.def("log_bytes", &log_bytes);
  m.def("site_names_since", &site_names_since);
  m.def("frames_supported", []() { return static_cast<bool>(MEMWARDEN_FRAMES); });
  m.def("scalar_type_names", &scalar_type_names);
  m.def("gc_instances", &gc_instances);
#if MEMWARDEN_FRAMES
  m.def("gc_anchors", []() { return g_anchors.size(); });  // how many chains the next scan starts from
#endif
  m.def("recording", []() { return g_recording.load(); });
  m.def("ring_attach", &ring_attach, py::arg("path"), py::arg("capacity"), py::arg("side_capacity"));
  m.def("ring_detach", &ring_detach);
  m.def("ring_origin", &ring_origin);
}
