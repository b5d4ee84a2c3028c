// Small helpers shared by the CLI's subcommands: deterministic random fills, token-list parsing, checksums,
// JSON files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moekit::cli {

/// Fills `n` floats with uniform values in [lo, hi) from `seed` (splitmix64); the same seed gives the same values
/// whatever the thread count.
void fill_uniform(float* out, int64_t n, uint64_t seed, float lo, float hi);

/// Same, rounded to bf16 bits, using every hardware thread for large n.
void fill_uniform_bf16(uint16_t* out, int64_t n, uint64_t seed, float lo, float hi);

/// Parses "1,16,64" into numbers. Throws InvalidArgument (op `op`) naming a bad entry.
std::vector<int64_t> parse_int_list(const std::string& op, const std::string& text);

/// Reads a text file of whitespace-separated floats as logits [tokens, experts] (row-major) and sets `tokens`.
/// Throws InvalidArgument (op `op`) naming the file when it cannot be opened, holds a word that is not a number, or
/// holds no values or a count that is not a multiple of `experts`.
std::vector<float> read_logits_file(const std::string& op, const std::string& path, int experts, int64_t& tokens);

/// Writes `text` and a newline to the file at `path` (a --json option). Throws InvalidArgument (op `op`) when the
/// file cannot be written.
void write_json_file(const std::string& op, const std::string& path, const std::string& text);

/// Sum and sum of absolute values (in double) of bf16 values: a checksum that is stable across runs.
struct Checksum {
  double sum = 0;
  double abs_sum = 0;
};
Checksum checksum_bf16(const uint16_t* data, int64_t n);

}  // namespace moekit::cli
