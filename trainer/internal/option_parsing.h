// trainer/internal/option_parsing.h — the value parsers ferry-trainer's flags (src/flags.cc) and
// --table settings (src/options.cc) share. Errors name `flag` and the text refused.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "ferry/trainer/options.h"

namespace ferry::trainer {

// "a,b,,c" -> {"a", "b", "", "c"}; "" -> {}.
std::vector<std::string_view> SplitComma(std::string_view s);
// A whole number in [min, max].
Status ParseInt(std::string_view flag, std::string_view text, int64_t min, int64_t max, int64_t* out);
// A finite number.
Status ParseFloat(std::string_view flag, std::string_view text, float* out);
Status ParseDouble(std::string_view flag, std::string_view text, double* out);
// The keys --table takes: lr, optimizer, consistency, wire, then SetSpecOption's.
const std::vector<std::string_view>& TableKeys();
// One --table PATTERN:key=value,... flag, each setting tried once on a scratch spec.
StatusOr<TableOverride> ParseTableOverride(std::string_view text);

}  // namespace ferry::trainer
