# Instruments everything this project compiles (Debian's gRPC, protobuf, yaml-cpp and OpenBLAS
# stay uninstrumented: ASan and UBSan only check dtrain's code and what it passes them; TSan
# may misread their internal synchronisation, see scripts/sanitizers/).
#   DTRAIN_SANITIZE=address,undefined   ASan + UBSan (gcc or clang)
#   DTRAIN_SANITIZE=thread              TSan (gcc or clang)
#   DTRAIN_FUZZ=ON                      clang only: ASan + UBSan plus libFuzzer's coverage
#                                       instrumentation (fuzzer-no-link), so the test binaries and
#                                       fuzz/'s targets come from one build folder.
# The scripts choose the optimisation (-O1) and the build folder; reports go where the
# *SAN_OPTIONS they set say (scripts/sanitizers/env.sh).
if(DTRAIN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "DTRAIN_FUZZ needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: "
                        "configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  if(DTRAIN_SANITIZE STREQUAL "")
    set(DTRAIN_SANITIZE address,undefined)
  elseif(NOT DTRAIN_SANITIZE MATCHES "address")
    message(FATAL_ERROR "DTRAIN_FUZZ builds with ASan; DTRAIN_SANITIZE=${DTRAIN_SANITIZE} "
                        "cannot be combined with it")
  endif()
endif()
if(NOT DTRAIN_SANITIZE STREQUAL "")
  if(DTRAIN_SANITIZE MATCHES "thread" AND DTRAIN_SANITIZE MATCHES "address")
    message(FATAL_ERROR "TSan and ASan cannot share a build: pick one in DTRAIN_SANITIZE")
  endif()
  set(san_flags -fsanitize=${DTRAIN_SANITIZE} -fno-omit-frame-pointer)
  if(DTRAIN_SANITIZE MATCHES "undefined")
    # Floats that do not fit an integer are undefined behaviour too (not in "undefined" for gcc).
    list(APPEND san_flags -fsanitize=float-cast-overflow)
  endif()
  add_compile_options(${san_flags} -g1)  # -g1: line tables, enough for symbolised stacks
  add_link_options(${san_flags})
  # DTRAIN_FUZZ's coverage instrumentation goes only on the libraries the fuzz targets drive
  # (dtrain_fuzz_coverage in lib/CMakeLists.txt) and the targets themselves: on train, launch,
  # the CLI and the tests it would cost a quarter more compile time and guide nothing.
  message(STATUS "dtrain: sanitizers ${DTRAIN_SANITIZE}")
endif()
function(dtrain_fuzz_coverage)
  if(DTRAIN_FUZZ)
    foreach(t ${ARGN})
      target_compile_options(${t} PRIVATE -fsanitize=fuzzer-no-link)
    endforeach()
  endif()
endfunction()
