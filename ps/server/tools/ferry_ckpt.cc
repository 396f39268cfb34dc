// ferry-ckpt: look inside a checkpoint folder (messages/CHECKPOINT.md) and export a table to
// numpy's .npy format, so a pipeline can take trained embeddings out of a job.
//
//   ferry-ckpt list DIR [--step N]      the steps kept, then the checkpoint CURRENT names (or the
//                                       newest that verifies; --step: that one): step, meaning,
//                                       servers, and each table
//   ferry-ckpt dump DIR TABLE OUT [--step N] [--state]
//                                       dense: OUT.npy, float32, the table's shape
//                                       sparse: OUT.ids.npy (int64, n) and OUT.rows.npy (float32,
//                                       n x dim), ids ascending; --state adds the optimizer's state,
//                                       OUT.state.npy: (slots, shape) dense, (slots, n, dim) sparse
//   ferry-ckpt export DIR TABLE OUT --since S [--step N] [--state]
//                                       what changed in TABLE after step S: from the checkpoint
//                                       of S (still kept) to CURRENT's (or N's), bit for bit
//                                       sparse: OUT.ids.npy, OUT.rows.npy (rows new or changed;
//                                       --state: or whose optimizer state changed, OUT.state.npy)
//                                       and OUT.deleted.npy (int64: ids no longer saved: evicted)
//                                       dense: OUT.ranges.npy (int64, k x 2: [begin, end) of the
//                                       flat element indices of each changed chunk) and
//                                       OUT.values.npy (float32, their values in that order);
//                                       --state: OUT.state.npy (slots, elements of the ranges)
//
// Exit status: 0 done, 1 no usable checkpoint or an I/O error, 2 bad usage, an unknown table, or
// (export) a --since step not kept or after the checkpoint exported, or a table declared otherwise.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "internal/checkpoint.h"
#include "internal/optimizer.h"

namespace {

using ferry::ps::CheckpointData;

int Usage() {
  std::fputs(
      "usage: ferry-ckpt list DIR [--step N]\n       ferry-ckpt dump DIR TABLE OUT [--step N] [--state]\n"
      "       ferry-ckpt export DIR TABLE OUT --since S [--step N] [--state]\n",
      stderr);
  return 2;
}

// What each optimizer's state slots hold, in order (the catalogue's slot names).
std::string SlotNames(ferry::OptimizerType type) {
  std::string out;
  if (const ferry::OptimizerInfo* info = ferry::FindOptimizer(type)) {
    for (const ferry::StateSlot& slot : info->slots) out += (out.empty() ? "" : ", ") + std::string(slot.name);
  }
  return out;
}

// Writes a little-endian C-order .npy file (format 1.0) of `count` values of `descr` ("<f4", "<i8").
bool WriteNpy(const std::string& path, const char* descr, const std::vector<int64_t>& shape, const void* data,
              size_t bytes) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ",";
  if (shape.size() > 1) dims.pop_back();  // (n,) for one dimension, (a,b) for more
  std::string header = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write(magic, 8);
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  out.close();
  if (!out) {
    std::fprintf(stderr, "ferry-ckpt: cannot write %s\n", path.c_str());
    return false;
  }
  std::printf("wrote %s\n", path.c_str());
  return true;
}

int List(const ferry::ps::KeptCheckpoints& kept, const CheckpointData& c) {
  std::string steps;
  for (int64_t s : kept.steps) steps += (steps.empty() ? "" : ", ") + std::to_string(s);
  std::printf("kept: step(s) %s; CURRENT names %s\n", steps.c_str(),
              kept.current >= 0 ? ("step " + std::to_string(kept.current)).c_str() : "none");
  std::printf("checkpoint %s: step %lld, %d server(s), %s\n", c.manifest.c_str(), static_cast<long long>(c.step),
              c.num_servers, c.meaning.c_str());
  for (const auto& [id, t] : c.tables) {
    if (t.spec.type == ferry::TableType::kDense) {
      std::string shape;
      for (int64_t d : t.spec.shape) {
        if (!shape.empty()) shape += 'x';
        shape += std::to_string(d);
      }
      std::printf("  %-24s dense  %s (%zu chunks)  %s\n", t.spec.name.c_str(), shape.c_str(), t.chunks.size(),
                  t.spec.ToString().c_str());
    } else {
      // A disk tier's rows are counted as they stream by, not held.
      size_t on_disk = 0;
      ferry::Status s = ferry::ps::ForEachDiskRow(t, id, [&](int64_t, int64_t, const float*) {
        ++on_disk;
        return ferry::Status::Ok();
      });
      if (!s.ok()) {
        std::fprintf(stderr, "ferry-ckpt: table '%s': %s\n", t.spec.name.c_str(), s.message().c_str());
        return 1;
      }
      const std::string disk = t.disk_stores.empty() ? "" : " (" + std::to_string(on_disk) + " of them on disk)";
      std::printf("  %-24s sparse %zu rows of dim %lld%s  %s\n", t.spec.name.c_str(), t.rows.size() + on_disk,
                  static_cast<long long>(t.spec.dim), disk.c_str(), t.spec.ToString().c_str());
    }
  }
  return 0;
}

// A dense table's parameters (OUT.npy) and, with `state`, its optimizer state (OUT.state.npy,
// [slots, shape...]; chunk c's slot k is its state[k * size, (k + 1) * size)).
int DumpDense(const CheckpointData::Table& t, const std::string& out, bool state) {
  const int slots = ferry::ps::StateSlots(t.spec.optimizer.type);
  const size_t n = static_cast<size_t>(t.spec.num_elements());
  std::vector<float> values, slot_values(state ? n * static_cast<size_t>(slots) : 0);
  values.reserve(n);
  for (const auto& [index, chunk] : t.chunks) {
    const size_t at = values.size(), size = chunk.params.size();
    values.insert(values.end(), chunk.params.begin(), chunk.params.end());
    if (chunk.state.size() != size * static_cast<size_t>(slots) || at + size > n) break;  // reported below
    for (size_t k = 0; state && k < static_cast<size_t>(slots); ++k) {
      std::copy_n(chunk.state.begin() + static_cast<std::ptrdiff_t>(k * size), size, slot_values.begin() +
                  static_cast<std::ptrdiff_t>(k * n + at));
    }
  }
  if (values.size() != n) {
    std::fprintf(stderr, "ferry-ckpt: table '%s' has %zu of its %zu values (or a chunk's state has the wrong size)\n",
                 t.spec.name.c_str(), values.size(), n);
    return 1;
  }
  if (!WriteNpy(out + ".npy", "<f4", t.spec.shape, values.data(), n * sizeof(float))) return 1;
  if (!state) return 0;
  std::vector<int64_t> shape = {slots};
  shape.insert(shape.end(), t.spec.shape.begin(), t.spec.shape.end());
  return WriteNpy(out + ".state.npy", "<f4", shape, slot_values.data(), slot_values.size() * sizeof(float)) ? 0 : 1;
}

// A sparse table's ids and rows and, with `state`, its optimizer state ([slots, n, dim]; a row's
// values are its parameters then each slot's dim floats).
int DumpSparse(const CheckpointData::Table& t, const std::string& out, bool state) {
  const size_t dim = static_cast<size_t>(t.spec.dim),
               slots = static_cast<size_t>(ferry::ps::StateSlots(t.spec.optimizer.type));
  const size_t n = t.rows.size();
  std::vector<int64_t> ids;
  std::vector<float> rows, slot_values(state ? slots * n * dim : 0);
  for (const auto& [row_id, row] : t.rows) {  // a std::map: ids ascending
    if (row.values.size() != dim * (1 + slots)) {
      std::fprintf(stderr, "ferry-ckpt: table '%s': row %lld has %zu values, not %zu\n", t.spec.name.c_str(),
                   static_cast<long long>(row_id), row.values.size(), dim * (1 + slots));
      return 1;
    }
    const size_t i = ids.size();
    ids.push_back(row_id);
    rows.insert(rows.end(), row.values.begin(), row.values.begin() + static_cast<std::ptrdiff_t>(dim));
    for (size_t k = 0; state && k < slots; ++k) {
      std::copy_n(row.values.begin() + static_cast<std::ptrdiff_t>((1 + k) * dim), dim,
                  slot_values.begin() + static_cast<std::ptrdiff_t>((k * n + i) * dim));
    }
  }
  const int64_t rows_n = static_cast<int64_t>(n), d = t.spec.dim;
  if (!WriteNpy(out + ".ids.npy", "<i8", {rows_n}, ids.data(), ids.size() * sizeof(int64_t)) ||
      !WriteNpy(out + ".rows.npy", "<f4", {rows_n, d}, rows.data(), rows.size() * sizeof(float))) {
    return 1;
  }
  if (!state) return 0;
  return WriteNpy(out + ".state.npy", "<f4", {static_cast<int64_t>(slots), rows_n, d}, slot_values.data(),
                  slot_values.size() * sizeof(float))
             ? 0
             : 1;
}

int Dump(const CheckpointData& c, std::string_view name, const std::string& out, bool state) {
  for (const auto& [id, t] : c.tables) {
    if (t.spec.name != name) continue;
    std::printf("table '%s' of checkpoint %s (step %lld)\n", t.spec.name.c_str(), c.manifest.c_str(),
                static_cast<long long>(c.step));
    if (state) {
      const int slots = ferry::ps::StateSlots(t.spec.optimizer.type);
      if (slots == 0) {
        std::printf("no optimizer state: %s keeps none\n", std::string(OptimizerName(t.spec.optimizer.type)).c_str());
        state = false;
      } else {
        std::printf("optimizer state (%s): %d slot(s): %s\n", std::string(OptimizerName(t.spec.optimizer.type)).c_str(),
                    slots, SlotNames(t.spec.optimizer.type).c_str());
      }
    }
    return t.spec.type == ferry::TableType::kDense ? DumpDense(t, out, state) : DumpSparse(t, out, state);
  }
  std::fprintf(stderr, "ferry-ckpt: no table '%.*s' in %s\n", static_cast<int>(name.size()), name.data(),
               c.manifest.c_str());
  return 2;
}

// The rows of tables with a disk tier held in the checkpoint's copies of the servers' stores,
// put with the others (so every command sees both tiers); false, said, when a copy cannot be read.
bool FoldDiskRows(CheckpointData* c) {
  for (auto& [id, t] : c->tables) {
    std::vector<std::pair<int64_t, CheckpointData::Row>> more;
    const size_t floats = static_cast<size_t>(t.spec.dim * (1 + ferry::ps::StateSlots(t.spec.optimizer.type)));
    ferry::Status s = ferry::ps::ForEachDiskRow(t, id, [&](int64_t row_id, int64_t steps, const float* row) {
      more.push_back({row_id, CheckpointData::Row{steps, std::vector<float>(row, row + floats)}});
      return ferry::Status::Ok();
    });
    if (!s.ok()) {
      std::fprintf(stderr, "ferry-ckpt: table '%s': %s\n", t.spec.name.c_str(), s.message().c_str());
      return false;
    }
    for (auto& [row_id, row] : more) t.rows.emplace(row_id, std::move(row));
    t.disk_stores.clear();
  }
  return true;
}

const CheckpointData::Table* FindTable(const CheckpointData& c, std::string_view name) {
  for (const auto& [id, t] : c.tables) {
    if (t.spec.name == name) return &t;
  }
  return nullptr;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b, size_t n) {
  return a.size() >= n && b.size() >= n && std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0;
}

// A dense table's values and each optimizer slot's, flat in element order; false when its
// chunks do not hold every element once (with state of their size).
bool Flatten(const CheckpointData::Table& t, size_t slots, std::vector<float>* params,
             std::vector<std::vector<float>>* state) {
  const size_t n = static_cast<size_t>(t.spec.num_elements());
  state->assign(slots, {});
  for (const auto& [index, chunk] : t.chunks) {
    const size_t size = chunk.params.size();
    if (chunk.state.size() != size * slots || params->size() + size > n) return false;
    params->insert(params->end(), chunk.params.begin(), chunk.params.end());
    for (size_t k = 0; k < slots; ++k) {
      const auto from = chunk.state.begin() + static_cast<std::ptrdiff_t>(k * size);
      (*state)[k].insert((*state)[k].end(), from, from + static_cast<std::ptrdiff_t>(size));
    }
  }
  return params->size() == n;
}

// Dense: each chunk whose parameters (with `state`: or optimizer state) differ from the same
// elements of `base` (compared by element, so a base saved with other chunks compares too), as
// a range of the flat element indices with its values; every chunk when `base` lacks the table.
int ExportDense(const CheckpointData::Table& t, const CheckpointData::Table* base, const std::string& out,
                bool state) {
  const size_t slots = static_cast<size_t>(ferry::ps::StateSlots(t.spec.optimizer.type));
  std::vector<float> now, before;
  std::vector<std::vector<float>> now_state, before_state;
  if (!Flatten(t, slots, &now, &now_state)) {
    std::fprintf(stderr, "ferry-ckpt: table '%s': its chunks do not hold its %lld values once each\n",
                 t.spec.name.c_str(), static_cast<long long>(t.spec.num_elements()));
    return 1;
  }
  if (base != nullptr && !Flatten(*base, slots, &before, &before_state)) {
    std::fprintf(stderr, "ferry-ckpt: table '%s' of the checkpoint of --since: its chunks do not hold its values "
                 "once each\n", t.spec.name.c_str());
    return 1;
  }
  auto same = [](const std::vector<float>& a, const std::vector<float>& b, size_t at, size_t size) {
    return std::memcmp(a.data() + at, b.data() + at, size * sizeof(float)) == 0;
  };
  std::vector<int64_t> ranges;
  std::vector<float> values;
  std::vector<std::vector<float>> slot_values(state ? slots : 0);
  size_t at = 0, changed = 0;
  for (const auto& [index, chunk] : t.chunks) {
    const size_t size = chunk.params.size();
    bool unchanged = base != nullptr && same(now, before, at, size);
    for (size_t k = 0; unchanged && state && k < slots; ++k) unchanged = same(now_state[k], before_state[k], at, size);
    if (!unchanged) {
      ranges.push_back(static_cast<int64_t>(at));
      ranges.push_back(static_cast<int64_t>(at + size));
      values.insert(values.end(), chunk.params.begin(), chunk.params.end());
      for (size_t k = 0; k < slot_values.size(); ++k) {
        const auto from = now_state[k].begin() + static_cast<std::ptrdiff_t>(at);
        slot_values[k].insert(slot_values[k].end(), from, from + static_cast<std::ptrdiff_t>(size));
      }
      changed += size;
    }
    at += size;
  }
  std::printf("%zu of %zu chunk(s) changed: %zu of %zu values\n", ranges.size() / 2, t.chunks.size(), changed, at);
  const int64_t k = static_cast<int64_t>(ranges.size() / 2);
  if (!WriteNpy(out + ".ranges.npy", "<i8", {k, 2}, ranges.data(), ranges.size() * sizeof(int64_t)) ||
      !WriteNpy(out + ".values.npy", "<f4", {static_cast<int64_t>(changed)}, values.data(),
                values.size() * sizeof(float))) {
    return 1;
  }
  if (!state) return 0;
  std::vector<float> all;
  for (const auto& v : slot_values) all.insert(all.end(), v.begin(), v.end());
  return WriteNpy(out + ".state.npy", "<f4", {static_cast<int64_t>(slots), static_cast<int64_t>(changed)}, all.data(),
                  all.size() * sizeof(float))
             ? 0
             : 1;
}

// Sparse: the rows `t` saves whose values (with `state`: or optimizer state) differ from `base`'s
// or that `base` lacks, and the ids `base` saved that `t` does not (evicted, or back at their
// initial values: a row never updated is not saved).
int ExportSparse(const CheckpointData::Table& t, const CheckpointData::Table* base, const std::string& out,
                 bool state) {
  const size_t dim = static_cast<size_t>(t.spec.dim),
               slots = static_cast<size_t>(ferry::ps::StateSlots(t.spec.optimizer.type));
  const size_t compared = state ? dim * (1 + slots) : dim;
  CheckpointData::Table changed_rows;
  changed_rows.spec = t.spec;
  for (const auto& [row_id, row] : t.rows) {
    if (base != nullptr) {
      auto it = base->rows.find(row_id);
      if (it != base->rows.end() && SameBits(it->second.values, row.values, compared)) continue;
    }
    changed_rows.rows.emplace(row_id, row);
  }
  std::vector<int64_t> deleted;
  if (base != nullptr) {
    for (const auto& [row_id, row] : base->rows) {
      if (!t.rows.contains(row_id)) deleted.push_back(row_id);
    }
  }
  std::printf("%zu of %zu row(s) new or changed, %zu deleted\n", changed_rows.rows.size(), t.rows.size(),
              deleted.size());
  const int rc = DumpSparse(changed_rows, out, state);
  if (rc != 0) return rc;
  return WriteNpy(out + ".deleted.npy", "<i8", {static_cast<int64_t>(deleted.size())}, deleted.data(),
                  deleted.size() * sizeof(int64_t))
             ? 0
             : 1;
}

int Export(const CheckpointData& base, const CheckpointData& c, std::string_view name, const std::string& out,
           bool state) {
  const CheckpointData::Table* t = FindTable(c, name);
  if (t == nullptr) {
    std::fprintf(stderr, "ferry-ckpt: no table '%.*s' in %s\n", static_cast<int>(name.size()), name.data(),
                 c.manifest.c_str());
    return 2;
  }
  const CheckpointData::Table* before = FindTable(base, name);
  if (before != nullptr && (before->spec.type != t->spec.type || before->spec.dim != t->spec.dim ||
                            before->spec.shape != t->spec.shape ||
                            before->spec.optimizer.type != t->spec.optimizer.type)) {
    std::fprintf(stderr,
                 "ferry-ckpt: table '%s' is declared otherwise in %s (%s) than in %s (%s): no changes can be "
                 "taken from one to the other\n",
                 t->spec.name.c_str(), base.manifest.c_str(), before->spec.ToString().c_str(), c.manifest.c_str(),
                 t->spec.ToString().c_str());
    return 2;
  }
  std::printf("table '%s': what changed after step %lld (%s) up to step %lld (%s)%s\n", t->spec.name.c_str(),
              static_cast<long long>(base.step), base.manifest.c_str(), static_cast<long long>(c.step),
              c.manifest.c_str(), before == nullptr ? "; it is not in the first: all of it" : "");
  if (state && ferry::ps::StateSlots(t->spec.optimizer.type) == 0) state = false;
  return t->spec.type == ferry::TableType::kDense ? ExportDense(*t, before, out, state)
                                                   : ExportSparse(*t, before, out, state);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string_view> args;
  int64_t step = -1, since = -1;
  bool state = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--state") {
      state = true;
    } else if (a == "--step" || a == "--since") {
      if (i + 1 >= argc) return Usage();
      const std::string_view v = argv[++i];
      int64_t& into = a == "--step" ? step : since;
      const auto [end, err] = std::from_chars(v.data(), v.data() + v.size(), into);
      if (err != std::errc() || end != v.data() + v.size() || into < 0) {
        std::fprintf(stderr, "ferry-ckpt: %s '%s' is not a step (a whole number >= 0)\n", argv[i - 1], argv[i]);
        return 2;
      }
    } else if (a.starts_with("--")) {
      std::fprintf(stderr, "ferry-ckpt: unknown flag %s\n", argv[i]);
      return Usage();
    } else {
      args.push_back(a);
    }
  }
  if (args.empty()) return Usage();
  const std::string_view cmd = args[0];
  if (!((cmd == "list" && args.size() == 2 && !state && since < 0) ||
        (cmd == "dump" && args.size() == 4 && since < 0) || (cmd == "export" && args.size() == 4 && since >= 0))) {
    return Usage();
  }
  const std::string dir(args[1]);
  auto kept = ferry::ps::ListCheckpoints(dir);
  if (!kept.ok()) {
    std::fprintf(stderr, "ferry-ckpt: %s\n", kept.status().message().c_str());
    return 1;
  }
  std::vector<std::string> skipped;
  auto c = step >= 0 ? ferry::ps::ReadCheckpointAt(dir, step) : ferry::ps::ReadCheckpoint(dir, &skipped);
  for (const auto& s : skipped) std::fprintf(stderr, "ferry-ckpt: passed over: %s\n", s.c_str());
  if (!c.ok()) {
    std::fprintf(stderr, "ferry-ckpt: %s\n", c.status().message().c_str());
    return c.status().code() == ferry::StatusCode::kNotFound && step >= 0 ? 2 : 1;
  }
  if (cmd == "list") return List(*kept, *c);
  // dump and export write whole tables: a disk tier's rows are read into RAM with the others.
  if (!FoldDiskRows(&*c)) return 1;
  if (cmd == "dump") return Dump(*c, args[2], std::string(args[3]), state);
  if (since > c->step) {
    std::fprintf(stderr, "ferry-ckpt: --since %lld is after the checkpoint exported (step %lld)\n",
                 static_cast<long long>(since), static_cast<long long>(c->step));
    return 2;
  }
  // The changes are taken against the checkpoint of `since` itself: it must still be kept.
  auto base = ferry::ps::ReadCheckpointAt(dir, since);
  if (!base.ok()) {
    std::fprintf(stderr, "ferry-ckpt: --since %lld: %s\n", static_cast<long long>(since),
                 base.status().message().c_str());
    return base.status().code() == ferry::StatusCode::kNotFound ? 2 : 1;
  }
  if (!FoldDiskRows(&*base)) return 1;
  return Export(*base, *c, args[2], std::string(args[3]), state);
}
