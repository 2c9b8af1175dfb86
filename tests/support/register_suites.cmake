# Run with cmake -P after a test executable is linked (see tests/CMakeLists.txt): lists its
# GoogleTest suites (one JSON listing) and writes one ctest entry per suite, named
# <PREFIX>.<suite>, that runs `<EXE> --gtest_filter=<suite>.*` and writes its results to
# <RESULTS_DIR>/<entry>.xml.
# Inputs (-D): EXE, PREFIX, OUTPUT (the ctest file to write), RESULTS_DIR, WORKING_DIRECTORY.
# With SOURCE_ROOT (tests/) and no PREFIX, as for an executable built from several folders,
# each suite's prefix is the folder under SOURCE_ROOT of the file that defines its tests, and
# <EXE>.<folder>.gtest_filter beside OUTPUT holds the --gtest_filter of each folder's suites.
cmake_minimum_required(VERSION 3.21)

# GoogleTest's JSON listing names every suite, its tests and each test's file. Brackets and
# semicolons in names would confuse CMake's list splitting; DISABLED_ suites and tests are left
# out, as GoogleTest runs none of them by default.
set(json_file "${OUTPUT}.json")
execute_process(COMMAND "${EXE}" --gtest_list_tests "--gtest_output=json:${json_file}"
                WORKING_DIRECTORY "${WORKING_DIRECTORY}"
                OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE rc TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}):\n${listing}\n${errors}")
endif()
file(READ "${json_file}" json)
file(REMOVE "${json_file}")
set(suites "")
set(counts "")
string(JSON n LENGTH "${json}" testsuites)
math(EXPR last "${n} - 1")
foreach(i RANGE 0 ${last})
  string(JSON entry GET "${json}" testsuites ${i})  # one suite, parsed alone below
  string(JSON suite GET "${entry}" name)
  string(REGEX REPLACE "[][;\\\\]" "_" suite "${suite}")
  if(suite MATCHES "(^|/)DISABLED_")
    continue()
  endif()
  string(JSON m LENGTH "${entry}" testsuite)
  math(EXPR m_last "${m} - 1")
  set(count 0)
  set(folders "")
  foreach(j RANGE 0 ${m_last})
    string(JSON test GET "${entry}" testsuite ${j} name)
    if(NOT test MATCHES "^DISABLED_")
      math(EXPR count "${count} + 1")
    endif()
    if(NOT PREFIX)  # the suite's folder: that of its tests' file
      string(JSON file GET "${entry}" testsuite ${j} file)
      file(RELATIVE_PATH rel "${SOURCE_ROOT}" "${file}")
      string(REGEX REPLACE "/.*" "" folder "${rel}")
      list(APPEND folders "${folder}")
    endif()
  endforeach()
  if(NOT PREFIX)
    list(REMOVE_DUPLICATES folders)
    list(LENGTH folders n_folders)
    if(NOT n_folders EQUAL 1)
      # its entry would run both folders' tests
      message(FATAL_ERROR "${EXE}: suite ${suite} has tests in ${folders}: one folder per suite")
    endif()
    set("folder_of_${suite}" "${folders}")
  endif()
  list(APPEND suites "${suite}")
  list(APPEND counts ${count})
endforeach()

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
