#include "ferry/data/criteo.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include <glob.h>

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

namespace {

// Every byte a hexadecimal digit (a table lookup a byte: find_first_not_of with a set of 22
// characters cost a third of the parsing rate).
bool IsHex(std::string_view s) {
  static constexpr auto kHex = [] {
    std::array<bool, 256> t{};
    for (char c : std::string_view("0123456789abcdefABCDEF")) t[static_cast<unsigned char>(c)] = true;
    return t;
  }();
  bool ok = true;
  for (char c : s) ok &= kHex[static_cast<unsigned char>(c)];
  return ok;
}

}  // namespace

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
    const std::string_view col =
        line.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start);
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
  for (int f = 0; f < kCriteoFields; ++f) {
    const std::string_view c = cols[1 + kCriteoDense + f];
    if (!IsHex(c)) {
      return InvalidArgumentError("categorical C" + std::to_string(f + 1) + " \"" + std::string(c.substr(0, 32)) +
                                  "\" is not hexadecimal");
    }
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
  if (max_line_bytes < 1024) return InvalidArgumentError("CriteoOptions: max_line_bytes < 1024");
  return Status::Ok();
}

StatusOr<CriteoShardBy> ParseCriteoShardBy(std::string_view name) {
  if (name == "auto") return CriteoShardBy::kAuto;
  if (name == "file") return CriteoShardBy::kFile;
  if (name == "line") return CriteoShardBy::kLine;
  std::string what = "'";  // appended, not "'" + ...: GCC 12 warns falsely (-Wrestrict) on that
  what.append(name.substr(0, 32)).append("' is not auto, file or line");
  return InvalidArgumentError(std::move(what));
}

const char* CriteoShardByName(CriteoShardBy by) {
  switch (by) {
    case CriteoShardBy::kFile: return "file";
    case CriteoShardBy::kLine: return "line";
    case CriteoShardBy::kAuto: break;
  }
  return "auto";
}

std::string CriteoBadLine::ToString() const { return path + ":" + std::to_string(line_number) + ": " + reason; }

namespace {

// Names in the order people count them: runs of digits compare as numbers, so day_2 comes
// before day_10 (ties between equal numbers, like 2 and 02, go to the shorter run).
bool NaturalLess(const std::string& a, const std::string& b) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      size_t ei = i, ej = j;
      while (ei < a.size() && digit(a[ei])) ++ei;
      while (ej < b.size() && digit(b[ej])) ++ej;
      size_t si = i, sj = j;  // leading zeros do not count
      while (si + 1 < ei && a[si] == '0') ++si;
      while (sj + 1 < ej && b[sj] == '0') ++sj;
      const std::string_view na(a.data() + si, ei - si), nb(b.data() + sj, ej - sj);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      if (ei - i != ej - j) return ei - i < ej - j;
      i = ei;
      j = ej;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandCriteoPaths(std::string_view list) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  auto add = [&](std::string path) {
    if (seen.insert(path).second) out.push_back(std::move(path));
  };
  if (list.empty()) return InvalidArgumentError("no file named");
  size_t start = 0;
  for (;;) {
    const size_t comma = list.find(',', start);
    const std::string entry(
        list.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (entry.empty()) return InvalidArgumentError("an empty entry in the file list '" + std::string(list) + "'");
    if (entry.find_first_of("*?[") == std::string::npos) {
      struct stat st;
      FERRY_RETURN_IF_ERROR(internal::StatPath(entry, &st));
      add(entry);
    } else {
      glob_t g{};
      const int rc = ::glob(entry.c_str(), GLOB_ERR, nullptr, &g);
      std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
      globfree(&g);
      if (rc == GLOB_NOMATCH || (rc == 0 && matches.empty())) return NotFoundError(entry + ": no file matches");
      if (rc != 0) return UnavailableError(entry + ": cannot list the files it matches");
      std::sort(matches.begin(), matches.end(), NaturalLess);
      for (auto& m : matches) add(std::move(m));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

struct CriteoReader::Impl {
  CriteoOptions options;
  std::vector<std::string> files;  // this shard's
  CriteoShardBy by = CriteoShardBy::kLine;
  size_t file = 0;                             // index into files of the one open (or next)
  std::optional<internal::LineReader> lines;   // the open file; none between files
  CriteoStats stats;
  int64_t line_in_file = 0;  // 0-based index of the next line of the open file
  int64_t closed_bytes = 0;  // bytes of this pass's files closed already
  Status failure;            // sticky read error

  // Opens files[file] if none is open. False at the end of the pass.
  StatusOr<bool> OpenNext() {
    if (lines) return true;
    if (file >= files.size()) return false;
    FERRY_ASSIGN_OR_RETURN(internal::GzFile f, internal::GzFile::Open(files[file]));
    lines.emplace(std::move(f), options.read_buffer_bytes, options.max_line_bytes);
    line_in_file = 0;
    ++stats.files;
    return true;
  }
  void CloseFile() {
    closed_bytes += lines->bytes();
    lines.reset();
    ++file;
  }
  void BadLine(int64_t line_number, std::string reason) {
    ++stats.bad_lines;
    if (static_cast<int>(stats.first_bad_lines.size()) < options.max_bad_line_records) {
      stats.first_bad_lines.push_back({files[file], line_number, std::move(reason)});
    }
  }
};

CriteoReader::CriteoReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CriteoReader::~CriteoReader() = default;

StatusOr<std::unique_ptr<CriteoReader>> CriteoReader::Open(const std::vector<std::string>& paths,
                                                           const CriteoOptions& options) {
  const std::string what = "CriteoReader(" + (paths.empty() ? std::string("no file") : paths[0]) +
                           (paths.size() > 1 ? " and " + std::to_string(paths.size() - 1) + " more" : std::string()) +
                           ")";
  FERRY_RETURN_IF_ERROR(options.Validate().WithContext(what));
  if (paths.empty()) return InvalidArgumentError(what + ": no file to read");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  const ShardSpec shard = options.shard;
  impl->by = options.shard_by != CriteoShardBy::kAuto ? options.shard_by
             : static_cast<int64_t>(paths.size()) >= shard.num_shards ? CriteoShardBy::kFile
                                                                       : CriteoShardBy::kLine;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (impl->by == CriteoShardBy::kLine || static_cast<int>(i % static_cast<size_t>(shard.num_shards)) == shard.rank) {
      impl->files.push_back(paths[i]);
    }
  }
  if (impl->files.empty()) {
    return InvalidArgumentError(what + ": sharding " + std::to_string(paths.size()) + " file(s) by file leaves shard " +
                                std::to_string(shard.rank) + " of " + std::to_string(shard.num_shards) +
                                " none; shard by line instead");
  }
  // Every file is opened once here, so a missing or unreadable one fails now, not hours in.
  for (const std::string& f : impl->files) FERRY_RETURN_IF_ERROR(internal::GzFile::Open(f).status());
  return std::unique_ptr<CriteoReader>(new CriteoReader(std::move(impl)));
}

StatusOr<std::unique_ptr<CriteoReader>> CriteoReader::Open(const std::string& path, const CriteoOptions& options) {
  return Open(std::vector<std::string>{path}, options);
}

StatusOr<int64_t> CriteoReader::ReadBatch(int64_t max_examples, CtrBatch* batch) {
  Impl& d = *impl_;
  if (max_examples < 1) {
    return InvalidArgumentError("CriteoReader::ReadBatch: max_examples " + std::to_string(max_examples) + " < 1");
  }
  FERRY_RETURN_IF_ERROR(d.failure);
  batch->Reset(kCriteoDense, kCriteoFields);
  const ShardSpec shard = d.options.shard;
  const bool by_line = d.by == CriteoShardBy::kLine;
  std::string_view line;
  while (batch->size() < max_examples) {
    StatusOr<bool> open = d.OpenNext();
    if (!open.ok()) {
      d.failure = open.status();
      return d.failure;
    }
    if (!*open) break;
    bool too_long = false;
    StatusOr<bool> more = d.lines->Next(&line, &too_long);
    if (!more.ok()) {
      d.failure = more.status();
      return d.failure;
    }
    if (!*more) {
      d.CloseFile();
      continue;
    }
    const int64_t index = d.line_in_file++;
    if (by_line && index % shard.num_shards != shard.rank) continue;
    ++d.stats.lines;
    if (too_long) {
      d.BadLine(index + 1, "longer than " + std::to_string(d.options.max_line_bytes) + " bytes");
      continue;
    }
    Status parsed = ParseCriteoLine(line, d.options.hash_buckets, batch);
    if (parsed.ok()) {
      ++d.stats.examples;
    } else {
      d.BadLine(index + 1, parsed.message());
    }
  }
  d.stats.bytes = d.closed_bytes + (d.lines ? d.lines->bytes() : 0);
  return batch->size();
}

Status CriteoReader::Rewind() {
  Impl& d = *impl_;
  FERRY_RETURN_IF_ERROR(d.failure);
  d.lines.reset();
  d.file = 0;
  d.closed_bytes = 0;
  d.stats = CriteoStats();
  return Status::Ok();
}

const CriteoStats& CriteoReader::stats() const { return impl_->stats; }
const std::vector<std::string>& CriteoReader::files() const { return impl_->files; }
CriteoShardBy CriteoReader::shard_by() const { return impl_->by; }

CriteoStream::CriteoStream(std::unique_ptr<CriteoReader> reader, int64_t pass_limit, bool read_ahead)
    : reader_(std::move(reader)), pass_limit_(std::max<int64_t>(pass_limit, 0)), read_ahead_(read_ahead) {
  carry_.Reset(kCriteoDense, kCriteoFields);
}

CriteoStream::~CriteoStream() {
  if (ahead_.valid()) ahead_.wait();
}

CriteoStream::Chunk CriteoStream::Read(int64_t n) {
  Chunk c;
  c.batch.Reset(kCriteoDense, kCriteoFields);
  c.first_pass = pass_;
  auto fail = [&](Status s) {
    c.status = std::move(s);
    return std::move(c);
  };
  while (c.batch.size() < n) {
    int64_t want = n - c.batch.size();
    if (pass_limit_ > 0) want = std::min(want, pass_limit_ - in_pass_);
    int64_t got = 0;
    if (want > 0) {
      StatusOr<int64_t> read = reader_->ReadBatch(want, &scratch_);
      if (!read.ok()) return fail(read.status());
      got = *read;
    }
    if (got == 0) {  // the pass is over
      const CriteoStats& st = reader_->stats();
      if (in_pass_ == 0) {
        std::string what = "no usable example in " + std::to_string(reader_->files().size()) + " file(s) (" +
                           reader_->files()[0] + (reader_->files().size() > 1 ? ", ..." : "") +
                           "): " + std::to_string(st.lines) + " line(s) of this shard, " +
                           std::to_string(st.bad_lines) + " bad";
        for (const CriteoBadLine& b : st.first_bad_lines) what += "; " + b.ToString();
        return fail(InvalidArgumentError(std::move(what)));
      }
      c.crossings.push_back({c.batch.size(), {pass_, st}});
      if (Status s = reader_->Rewind(); !s.ok()) return fail(s);
      ++pass_;
      in_pass_ = 0;
      continue;
    }
    in_pass_ += got;
    c.batch.Append(scratch_);
  }
  return c;
}

void CriteoStream::Use(Chunk& chunk) {
  const int64_t base = carry_.size();
  if (base == 0) carry_pass_ = chunk.first_pass;  // (an empty carry has no crossings)
  for (Crossing& x : chunk.crossings) carry_crossings_.push_back({base + x.at, std::move(x.pass)});
  carry_.Append(chunk.batch);
}

Status CriteoStream::Take(int64_t n, CtrBatch* batch, int64_t ahead) {
  if (n < 1) return InvalidArgumentError("CriteoStream: " + std::to_string(n) + " examples asked for");
  FERRY_RETURN_IF_ERROR(failed_);
  auto use = [&](Chunk chunk) -> Status {
    if (!chunk.status.ok()) {
      failed_ = chunk.status;
      return failed_;
    }
    Use(chunk);
    return Status::Ok();
  };
  // What was read ahead first (its batch was read after carry_'s examples), then more if short.
  if (carry_.size() < n && ahead_.valid()) FERRY_RETURN_IF_ERROR(use(ahead_.get()));
  if (carry_.size() < n) FERRY_RETURN_IF_ERROR(use(Read(n - carry_.size())));
  batch->Reset(kCriteoDense, kCriteoFields);
  if (carry_.size() == n) {
    std::swap(*batch, carry_);
    carry_.Reset(kCriteoDense, kCriteoFields);
  } else {  // more was read ahead than asked for: hand out the first n, keep the rest in order
    const auto f = static_cast<size_t>(carry_.num_fields), d = static_cast<size_t>(carry_.num_dense);
    const auto k = static_cast<size_t>(n);
    batch->labels.assign(carry_.labels.begin(), carry_.labels.begin() + k);
    batch->dense.assign(carry_.dense.begin(), carry_.dense.begin() + k * d);
    batch->ids.assign(carry_.ids.begin(), carry_.ids.begin() + k * f);
    carry_.labels.erase(carry_.labels.begin(), carry_.labels.begin() + k);
    carry_.dense.erase(carry_.dense.begin(), carry_.dense.begin() + k * d);
    carry_.ids.erase(carry_.ids.begin(), carry_.ids.begin() + k * f);
  }
  // The passes ended before the examples handed out are reported; the pass of the last of them
  // is the carry's first pass after them.
  std::vector<Crossing> kept;
  for (Crossing& x : carry_crossings_) {
    if (x.at < n) {
      finished_.push_back(std::move(x.pass));
      ++carry_pass_;
    } else {
      kept.push_back({x.at - n, std::move(x.pass)});
    }
  }
  carry_crossings_ = std::move(kept);
  pass_handed_ = carry_pass_;
  if (ahead > 0 && !ahead_.valid()) ahead_ = std::async(std::launch::async, [this, ahead] { return Read(ahead); });
  return Status::Ok();
}

Status CriteoStream::Next(int64_t n, CtrBatch* batch) { return Take(n, batch, read_ahead_ ? n : 0); }

Status CriteoStream::Skip(int64_t n) {
  CtrBatch scratch;
  for (int64_t left = n; left > 0;) {
    const int64_t k = std::min<int64_t>(left, 4096);
    FERRY_RETURN_IF_ERROR(Take(k, &scratch, 0));
    left -= k;
  }
  return Status::Ok();
}

}  // namespace ferry::data
