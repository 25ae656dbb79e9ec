# Checking builds, all with clang (scripts/sanitize.sh makes them):
#   FUSELINK_SANITIZE  a list of sanitizers for every target: "address;undefined" or
#                      "thread". A UBSan finding aborts (-fno-sanitize-recover).
#   FUSELINK_FUZZ      the libFuzzer targets in tests/fuzz; needs "address;undefined".
#                      Every target gets libFuzzer's coverage hooks (fuzzer-no-link),
#                      so that a fuzzer is guided through the libraries it calls.
# Any clang build also checks the ABSL_GUARDED_BY annotations (-Wthread-safety).
set(FUSELINK_SANITIZE "" CACHE STRING
    "clang sanitizers for every target: address;undefined, or thread")
option(FUSELINK_FUZZ "build the libFuzzer targets in tests/fuzz (clang)" OFF)

# Checking builds run the debug-only invariants too (agent/common/check.h).
option(FUSELINK_DCHECK "run FL_DCHECK and abort on FL_EXPECT (agent/common/check.h)" OFF)
if(FUSELINK_DCHECK OR FUSELINK_SANITIZE OR FUSELINK_FUZZ OR CMAKE_BUILD_TYPE STREQUAL "Debug")
  add_compile_definitions(FUSELINK_DCHECK)
endif()

if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  add_compile_options(-Wthread-safety -Werror=thread-safety-analysis)
elseif(FUSELINK_SANITIZE OR FUSELINK_FUZZ)
  message(FATAL_ERROR "FUSELINK_SANITIZE and FUSELINK_FUZZ need clang "
                      "(-DCMAKE_CXX_COMPILER=clang++)")
endif()

if(FUSELINK_SANITIZE)
  foreach(s ${FUSELINK_SANITIZE})
    if(NOT s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "FUSELINK_SANITIZE: unknown sanitizer '${s}'")
    endif()
  endforeach()
  if("thread" IN_LIST FUSELINK_SANITIZE AND NOT FUSELINK_SANITIZE STREQUAL "thread")
    message(FATAL_ERROR "FUSELINK_SANITIZE: thread goes alone")
  endif()
  list(JOIN FUSELINK_SANITIZE "," fl_sanitizers)
  # Line tables (inlined frames included) are all a report's stack needs; the full
  # debug info of -g made these builds' compiles about a sixth slower.
  add_compile_options(-fsanitize=${fl_sanitizers} -fno-omit-frame-pointer
                      -gline-tables-only)
  add_link_options(-fsanitize=${fl_sanitizers})
  if("undefined" IN_LIST FUSELINK_SANITIZE)
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()

if(FUSELINK_FUZZ)
  if(NOT "address" IN_LIST FUSELINK_SANITIZE OR NOT "undefined" IN_LIST FUSELINK_SANITIZE)
    message(FATAL_ERROR "FUSELINK_FUZZ needs FUSELINK_SANITIZE=address;undefined")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

# Tests with these labels run in the plain build only: they need hardware or a
# testbed, or are shell and Python tests of tools the checking builds do not build,
# or (soak) two minutes of load whose bounds are for real speed, or (docs) read the
# source tree and nothing a sanitizer sees, or (packaging) install and package the
# release build; the stress test is the checking builds' concurrency load.
set(FUSELINK_PLAIN_ONLY_LABELS gpu rdma testbed python metrics deploy tools soak docs
  packaging)

# Records `target` as a test binary that the checking builds build and run, unless
# one of `labels` is plain-only.
function(fuselink_checked_binary target labels)
  foreach(label ${labels})
    if(label IN_LIST FUSELINK_PLAIN_ONLY_LABELS)
      return()
    endif()
  endforeach()
  set_property(GLOBAL APPEND PROPERTY FUSELINK_CHECKED_BINARIES ${target})
endfunction()

# Every directory below `dir`, itself included, into `out`.
function(fuselink_directories dir out)
  set(dirs ${dir})
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub ${subdirs})
    fuselink_directories(${sub} below)
    list(APPEND dirs ${below})
  endforeach()
  set(${out} ${dirs} PARENT_SCOPE)
endfunction()

# Called once every target and test exists (end of the top CMakeLists.txt).
function(fuselink_finish_checking_builds)
  # What scripts/sanitize.sh builds and runs: target checked_tests, and ctest -LE
  # with the regex in plain_only_labels.txt.
  get_property(binaries GLOBAL PROPERTY FUSELINK_CHECKED_BINARIES)
  add_custom_target(checked_tests)
  add_dependencies(checked_tests ${binaries})
  list(JOIN FUSELINK_PLAIN_ONLY_LABELS "|" labels)
  file(WRITE ${CMAKE_BINARY_DIR}/plain_only_labels.txt "^(${labels})$\n")
  if(NOT FUSELINK_SANITIZE)
    return()
  endif()

  # Every executable carries the sanitizers' options (tests/sanitizers/options.cc), so
  # that a test, an agent it starts and a binary run by hand all fail on a report.
  add_library(fuselink_sanitizer_options OBJECT
              ${CMAKE_SOURCE_DIR}/tests/sanitizers/options.cc)
  target_compile_definitions(fuselink_sanitizer_options PRIVATE
      FUSELINK_SANITIZER_DIR="${CMAKE_SOURCE_DIR}/tests/sanitizers")
  set(objects fuselink_sanitizer_options)
  if(FUSELINK_SANITIZE STREQUAL "thread")
    add_library(fuselink_tsan_absl OBJECT
                ${CMAKE_SOURCE_DIR}/tests/sanitizers/absl_mutex_annotations.cc)
    target_link_libraries(fuselink_tsan_absl PUBLIC absl::synchronization ${CMAKE_DL_LIBS})
    list(APPEND objects fuselink_tsan_absl)
  endif()
  fuselink_directories(${CMAKE_SOURCE_DIR} dirs)
  foreach(dir ${dirs})
    get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target ${targets})
      get_target_property(type ${target} TYPE)
      if(type STREQUAL "EXECUTABLE")
        target_link_libraries(${target} PRIVATE ${objects})
      endif()
    endforeach()
  endforeach()
endfunction()
