#include "ferry/data/criteo.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

#include "gz_file.h"
#include "random.h"

namespace ferry::data {

int64_t CriteoFieldId(int field, std::string_view value, int64_t hash_buckets) {
  const uint64_t h = internal::Mix64(internal::Fnv1a64(value) ^ internal::Mix64(static_cast<uint64_t>(field) + 1));
  if (hash_buckets <= 0) return static_cast<int64_t>(h >> 1);
  return int64_t{field} * hash_buckets + static_cast<int64_t>(h % static_cast<uint64_t>(hash_buckets));
}

float CriteoDenseValue(int64_t x) {
  return x <= 0 ? 0.0f : static_cast<float>(std::log1p(static_cast<double>(x)));
}

Status ParseCriteoLine(std::string_view line, int64_t hash_buckets, CtrBatch* batch) {
  if (batch->num_dense != kCriteoDense || batch->num_fields != kCriteoFields) {
    return InvalidArgumentError("ParseCriteoLine: the batch is shaped (" + std::to_string(batch->num_dense) + ", " +
                                std::to_string(batch->num_fields) + "), Criteo needs (13, 26)");
  }
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);

  std::array<std::string_view, kCriteoColumns> cols;
  int n = 0;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    const std::string_view col = line.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start);
    if (n < kCriteoColumns) cols[n] = col;
    ++n;
    if (tab == std::string_view::npos) break;
    start = tab + 1;
  }
  if (n != kCriteoColumns) {
    return InvalidArgumentError(std::to_string(n) + " tab-separated fields, expected " +
                                std::to_string(kCriteoColumns));
  }
  if (cols[0] != "0" && cols[0] != "1") {
    return InvalidArgumentError("label \"" + std::string(cols[0].substr(0, 32)) + "\" is not 0 or 1");
  }
  std::array<float, kCriteoDense> dense;
  for (int j = 0; j < kCriteoDense; ++j) {
    const std::string_view s = cols[1 + j];
    int64_t x = 0;
    if (!s.empty()) {
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
      if (ec != std::errc() || end != s.data() + s.size()) {
        return InvalidArgumentError("integer feature I" + std::to_string(j + 1) + " \"" +
                                    std::string(s.substr(0, 32)) + "\" is not a decimal int64");
      }
    }
    dense[j] = CriteoDenseValue(x);
  }
  batch->labels.push_back(cols[0] == "1" ? 1.0f : 0.0f);
  batch->dense.insert(batch->dense.end(), dense.begin(), dense.end());
  for (int f = 0; f < kCriteoFields; ++f) {
    batch->ids.push_back(CriteoFieldId(f, cols[1 + kCriteoDense + f], hash_buckets));
  }
  return Status::Ok();
}

Status CriteoOptions::Validate() const {
  FERRY_RETURN_IF_ERROR(shard.Validate());
  if (hash_buckets < 0 || hash_buckets > std::numeric_limits<int64_t>::max() / kCriteoFields) {
    return InvalidArgumentError("CriteoOptions: hash_buckets " + std::to_string(hash_buckets) +
                                " is not in [0, INT64_MAX / 26]");
  }
  if (max_bad_line_records < 0) return InvalidArgumentError("CriteoOptions: max_bad_line_records < 0");
  if (read_buffer_bytes < 1024) return InvalidArgumentError("CriteoOptions: read_buffer_bytes < 1024");
  return Status::Ok();
}

struct CriteoReader::Impl {
  Impl(internal::LineReader lines, const CriteoOptions& options) : lines(std::move(lines)), options(options) {}

  internal::LineReader lines;
  CriteoOptions options;
  CriteoStats stats;
  int64_t next_line = 0;  // 0-based index of the next line of the file
  Status failure;         // sticky read error
};

CriteoReader::CriteoReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CriteoReader::~CriteoReader() = default;

StatusOr<std::unique_ptr<CriteoReader>> CriteoReader::Open(const std::string& path, const CriteoOptions& options) {
  FERRY_RETURN_IF_ERROR(options.Validate().WithContext("CriteoReader(" + path + ")"));
  FERRY_ASSIGN_OR_RETURN(internal::GzFile file, internal::GzFile::Open(path));
  auto impl = std::make_unique<Impl>(internal::LineReader(std::move(file), options.read_buffer_bytes), options);
  return std::unique_ptr<CriteoReader>(new CriteoReader(std::move(impl)));
}

StatusOr<int64_t> CriteoReader::ReadBatch(int64_t max_examples, CtrBatch* batch) {
  Impl& d = *impl_;
  if (max_examples < 1) {
    return InvalidArgumentError("CriteoReader::ReadBatch: max_examples " + std::to_string(max_examples) + " < 1");
  }
  FERRY_RETURN_IF_ERROR(d.failure);
  batch->Reset(kCriteoDense, kCriteoFields);
  const ShardSpec shard = d.options.shard;
  std::string_view line;
  while (batch->size() < max_examples) {
    StatusOr<bool> more = d.lines.Next(&line);
    if (!more.ok()) {
      d.failure = more.status();
      return d.failure;
    }
    if (!*more) break;
    const int64_t index = d.next_line++;
    if (index % shard.num_shards != shard.rank) continue;
    ++d.stats.lines;
    Status parsed = ParseCriteoLine(line, d.options.hash_buckets, batch);
    if (parsed.ok()) {
      ++d.stats.examples;
      continue;
    }
    ++d.stats.bad_lines;
    if (static_cast<int>(d.stats.first_bad_lines.size()) < d.options.max_bad_line_records) {
      d.stats.first_bad_lines.push_back({index + 1, parsed.message()});
    }
  }
  return batch->size();
}

Status CriteoReader::Rewind() {
  Impl& d = *impl_;
  FERRY_RETURN_IF_ERROR(d.failure);
  if (Status s = d.lines.Rewind(); !s.ok()) {
    d.failure = s;
    return s;
  }
  d.stats = CriteoStats();
  d.next_line = 0;
  return Status::Ok();
}

const CriteoStats& CriteoReader::stats() const { return impl_->stats; }
const std::string& CriteoReader::path() const { return impl_->lines.path(); }

}  // namespace ferry::data
