// moekit::Error: builds "moekit::<op>: <message>".
#include "moekit/error.h"

#include <string>

namespace moekit {

Error::Error(std::string_view op, std::string_view message)
    : std::runtime_error("moekit::" + std::string(op) + ": " + std::string(message)), op_(op) {}

}  // namespace moekit
