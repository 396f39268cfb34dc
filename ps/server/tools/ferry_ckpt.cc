// ferry-ckpt: look inside a checkpoint folder (messages/CHECKPOINT.md) and export a table to
// numpy's .npy format, so a pipeline can take trained embeddings out of a job.
//
//   ferry-ckpt list DIR                 the checkpoint CURRENT names (or the newest that verifies):
//                                       step, meaning, servers, and each table
//   ferry-ckpt dump DIR TABLE OUT       dense: OUT.npy, float32, the table's shape
//                                       sparse: OUT.ids.npy (int64, n) and OUT.rows.npy (float32,
//                                       n x dim), ids ascending; parameters only, no optimizer state
//
// Exit status: 0 done, 1 no usable checkpoint or an I/O error, 2 bad usage or unknown table.
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "internal/checkpoint.h"

namespace {

using ferry::ps::CheckpointData;

int Usage() {
  std::fputs("usage: ferry-ckpt list DIR\n       ferry-ckpt dump DIR TABLE OUT\n", stderr);
  return 2;
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

int List(const CheckpointData& c) {
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
      std::printf("  %-24s sparse %zu rows of dim %lld  %s\n", t.spec.name.c_str(), t.rows.size(),
                  static_cast<long long>(t.spec.dim), t.spec.ToString().c_str());
    }
  }
  return 0;
}

int Dump(const CheckpointData& c, std::string_view name, const std::string& out) {
  for (const auto& [id, t] : c.tables) {
    if (t.spec.name != name) continue;
    if (t.spec.type == ferry::TableType::kDense) {
      std::vector<float> values;
      values.reserve(static_cast<size_t>(t.spec.num_elements()));
      for (const auto& [index, chunk] : t.chunks) values.insert(values.end(), chunk.params.begin(), chunk.params.end());
      if (static_cast<int64_t>(values.size()) != t.spec.num_elements()) {
        std::fprintf(stderr, "ferry-ckpt: table '%s' has %zu of its %lld values\n", t.spec.name.c_str(), values.size(),
                     static_cast<long long>(t.spec.num_elements()));
        return 1;
      }
      return WriteNpy(out + ".npy", "<f4", t.spec.shape, values.data(), values.size() * sizeof(float)) ? 0 : 1;
    }
    std::vector<int64_t> ids;
    std::vector<float> rows;
    for (const auto& [row_id, row] : t.rows) {  // a std::map: ids ascending
      ids.push_back(row_id);
      rows.insert(rows.end(), row.values.begin(), row.values.begin() + t.spec.dim);
    }
    const int64_t n = static_cast<int64_t>(ids.size());
    return WriteNpy(out + ".ids.npy", "<i8", {n}, ids.data(), ids.size() * sizeof(int64_t)) &&
                   WriteNpy(out + ".rows.npy", "<f4", {n, t.spec.dim}, rows.data(), rows.size() * sizeof(float))
               ? 0
               : 1;
  }
  std::fprintf(stderr, "ferry-ckpt: no table '%.*s' in %s\n", static_cast<int>(name.size()), name.data(),
               c.manifest.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string_view cmd = argv[1];
  if (!((cmd == "list" && argc == 3) || (cmd == "dump" && argc == 5))) return Usage();
  std::vector<std::string> skipped;
  auto c = ferry::ps::ReadCheckpoint(argv[2], &skipped);
  for (const auto& s : skipped) std::fprintf(stderr, "ferry-ckpt: passed over: %s\n", s.c_str());
  if (!c.ok()) {
    std::fprintf(stderr, "ferry-ckpt: %s\n", c.status().message().c_str());
    return 1;
  }
  return cmd == "list" ? List(*c) : Dump(*c, argv[3], argv[4]);
}
