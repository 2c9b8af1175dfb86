# Run with cmake -P after a test executable is linked (see tests/CMakeLists.txt): lists its
# GoogleTest suites and writes one ctest entry per suite, named <PREFIX>.<suite>, that runs
# `<EXE> --gtest_filter=<suite>.*` and writes its results to <RESULTS_DIR>/<entry>.xml.
# Inputs (-D): EXE, PREFIX, OUTPUT (the ctest file to write), RESULTS_DIR, WORKING_DIRECTORY.
# With SOURCE_ROOT (tests/) and no PREFIX, as for an executable built from several folders,
# each suite's prefix is the folder under SOURCE_ROOT of the file that defines its tests, and
# <EXE>.<folder>.gtest_filter beside OUTPUT holds the --gtest_filter of each folder's suites.
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

# The folder of every suite's tests, from GoogleTest's JSON listing (which names each test's
# file): a suite whose tests sit in two folders is an error, as its entry would run both.
if(NOT PREFIX)
  set(json_file "${OUTPUT}.json")
  execute_process(COMMAND "${EXE}" --gtest_list_tests "--gtest_output=json:${json_file}"
                  WORKING_DIRECTORY "${WORKING_DIRECTORY}" OUTPUT_QUIET
                  RESULT_VARIABLE rc TIMEOUT 120)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${EXE} --gtest_list_tests --gtest_output=json failed (${rc})")
  endif()
  file(READ "${json_file}" json)
  string(JSON n LENGTH "${json}" testsuites)
  math(EXPR last "${n} - 1")
  foreach(i RANGE 0 ${last})
    string(JSON entry GET "${json}" testsuites ${i})  # one suite: parsed alone below
    string(JSON name GET "${entry}" name)
    string(REGEX REPLACE "[][;\\\\]" "_" name "${name}")
    string(JSON m LENGTH "${entry}" testsuite)
    math(EXPR m_last "${m} - 1")
    set(folders "")
    foreach(j RANGE 0 ${m_last})
      string(JSON file GET "${entry}" testsuite ${j} file)
      file(RELATIVE_PATH rel "${SOURCE_ROOT}" "${file}")
      string(REGEX REPLACE "/.*" "" folder "${rel}")
      list(APPEND folders "${folder}")
    endforeach()
    list(REMOVE_DUPLICATES folders)
    list(LENGTH folders count)
    if(NOT count EQUAL 1)
      message(FATAL_ERROR "${EXE}: suite ${name} has tests in ${folders}: one folder per suite")
    endif()
    set("folder_of_${name}" "${folders}")
  endforeach()
  foreach(suite IN LISTS suites)
    if(NOT DEFINED "folder_of_${suite}")
      message(FATAL_ERROR "${EXE}: suite ${suite} is missing from the JSON listing")
    endif()
  endforeach()
  file(REMOVE "${json_file}")
endif()

set(script "# Written by tests/support/register_suites.cmake from ${EXE} --gtest_list_tests\n")
set(total 0)
set(filters "")
foreach(suite count IN ZIP_LISTS suites counts)
  if(count EQUAL 0)
    continue()
  endif()
  math(EXPR total "${total} + ${count}")
  set(prefix "${PREFIX}")
  if(NOT PREFIX)
    set(prefix "${folder_of_${suite}}")
    if(NOT prefix IN_LIST filters)
      list(APPEND filters "${prefix}")
      set("filter_${prefix}" "")
    endif()
    string(APPEND "filter_${prefix}" "${suite}.*:")
  endif()
  set(name "${prefix}.${suite}")
  string(REPLACE "/" "_" xml "${name}")
  string(APPEND script
    "add_test([=[${name}]=] [=[${EXE}]=] [=[--gtest_filter=${suite}.*]=] "
    "[=[--gtest_output=xml:${RESULTS_DIR}/${xml}.xml]=])\n"
    "set_tests_properties([=[${name}]=] PROPERTIES WORKING_DIRECTORY [=[${WORKING_DIRECTORY}]=] "
    "LABELS gtest)\n")
endforeach()
string(APPEND script "# ${total} tests\n")
file(WRITE "${OUTPUT}" "${script}")
get_filename_component(dir "${OUTPUT}" DIRECTORY)
get_filename_component(exe_name "${EXE}" NAME)
foreach(prefix IN LISTS filters)
  string(REGEX REPLACE ":$" "" filter "${filter_${prefix}}")
  file(WRITE "${dir}/${exe_name}.${prefix}.gtest_filter" "${filter}\n")
endforeach()
