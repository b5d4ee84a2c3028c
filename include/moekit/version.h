// moekit's library version. It is part of every persisted tuning cache's metadata, so a cache written by another
// version is ignored rather than trusted. Keep it equal to project(VERSION) in the top CMakeLists.txt.
#pragma once

#include <string_view>

namespace moekit {

inline constexpr int kVersionMajor = 0;
inline constexpr int kVersionMinor = 1;
inline constexpr int kVersionPatch = 0;
/// "major.minor.patch".
inline constexpr std::string_view kVersion = "0.1.0";

}  // namespace moekit
