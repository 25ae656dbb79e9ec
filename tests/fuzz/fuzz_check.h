// The one assertion of the fuzz targets: a property that failed is a crash, with
// the condition and where, which libFuzzer saves as an artifact.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FL_FUZZ_CHECK(condition)                                                 \
  do {                                                                           \
    if (!(condition)) {                                                          \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, \
                   #condition);                                                  \
      std::abort();                                                              \
    }                                                                            \
  } while (0)
