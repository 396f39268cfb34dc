// Suggestions for misspelled names: "unknown flag --lerning-rate (did you mean --lr?)".
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace ferry {

// The name in `names` nearest to `word` by edit distance (insertions, deletions, substitutions,
// and swaps of neighbours), when it is near enough to be a likely misspelling (at most a third
// of the word's letters, at least 1, at most 3); "" otherwise. Ties go to the earlier name.
std::string_view Nearest(std::string_view word, std::span<const std::string_view> names);

// " (did you mean NAME?)" for Nearest(word, names), or "".
std::string DidYouMean(std::string_view word, std::span<const std::string_view> names);

// The names joined with ", ".
std::string JoinNames(std::span<const std::string_view> names);

}  // namespace ferry
