# Run with cmake -P after a test executable is linked (see tests/CMakeLists.txt): lists its
# GoogleTest suites and writes one ctest entry per suite, named <PREFIX>.<suite>, that runs
# `<EXE> --gtest_filter=<suite>.*` and writes its results to <RESULTS_DIR>/<entry>.xml.
# Inputs (-D): EXE, PREFIX, OUTPUT (the ctest file to write), RESULTS_DIR, WORKING_DIRECTORY.
cmake_minimum_required(VERSION 3.21)

execute_process(COMMAND "${EXE}" --gtest_list_tests
                WORKING_DIRECTORY "${WORKING_DIRECTORY}"
                OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE rc TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}):\n${listing}\n${errors}")
endif()

# Suite lines start in column 0 ("Suite." or "Suite/float.  # TypeParam = float"), test
# lines with two spaces. Brackets and semicolons would confuse CMake's list splitting.
string(REGEX REPLACE "[][;\\\\]" "_" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(counts "")
set(suite "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
    if(suite MATCHES "(^|/)DISABLED_")
      set(suite "")  # not run, as GoogleTest does by default
    else()
      list(APPEND suites "${suite}")
      list(APPEND counts 0)
    endif()
  elseif(suite AND line MATCHES "^  [A-Za-z0-9_]" AND NOT line MATCHES "^  DISABLED_")
    list(LENGTH counts n)
    math(EXPR last "${n} - 1")
    list(GET counts ${last} count)
    math(EXPR count "${count} + 1")
    list(REMOVE_AT counts ${last})
    list(APPEND counts ${count})
  endif()
endforeach()

set(script "# Written by tests/support/register_suites.cmake from ${EXE} --gtest_list_tests\n")
set(total 0)
foreach(suite count IN ZIP_LISTS suites counts)
  if(count EQUAL 0)
    continue()
  endif()
  math(EXPR total "${total} + ${count}")
  set(name "${PREFIX}.${suite}")
  string(REPLACE "/" "_" xml "${name}")
  string(APPEND script
    "add_test([=[${name}]=] [=[${EXE}]=] [=[--gtest_filter=${suite}.*]=] "
    "[=[--gtest_output=xml:${RESULTS_DIR}/${xml}.xml]=])\n"
    "set_tests_properties([=[${name}]=] PROPERTIES WORKING_DIRECTORY [=[${WORKING_DIRECTORY}]=] "
    "LABELS gtest)\n")
endforeach()
string(APPEND script "# ${total} tests\n")
file(WRITE "${OUTPUT}" "${script}")
