// The consumer's program: runs the shared object's check (engine.cpp) and reports; exits 1 on any difference. It
// links the shared object alone, so moekit's code must be inside it.
#include <cstdio>

extern "C" const char* moekit_consumer_version();
extern "C" int moekit_consumer_differences();

int main() {
  const int differences = moekit_consumer_differences();
  std::printf("moekit %s consumer: %s\n", moekit_consumer_version(), differences == 0 ? "ok" : "WRONG");
  return differences == 0 ? 0 : 1;
}
