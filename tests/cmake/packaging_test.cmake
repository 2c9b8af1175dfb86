# Run with cmake -P; see CMakeLists.txt here. Inputs (-D): STEP (install | find_package |
# add_subdirectory), SOURCE_DIR, CONSUMER_DIR, BUILD_DIR, PREFIX, GENERATOR,
# CHILD_OPTIONS ('|'-separated -D options), CHILD_CXX_FLAGS.
cmake_minimum_required(VERSION 3.21)

string(REPLACE "|" ";" child_options "${CHILD_OPTIONS}")
set(config_args --config Debug)  # the children are Debug builds (multi-config generators too)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}): ${ARGN}")
  endif()
endfunction()

# Every run starts from an empty directory, so a stale cache cannot hide a problem.
file(REMOVE_RECURSE "${BUILD_DIR}")

if(STEP STREQUAL "install")
  file(REMOVE_RECURSE "${PREFIX}")
  run("configuring attn" ${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${BUILD_DIR}" -G "${GENERATOR}"
      ${child_options} -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_EXAMPLES=OFF
      -DATTN_BUILD_BENCHMARKS=OFF -DATTN_INSTALL=ON "-DCMAKE_INSTALL_PREFIX=${PREFIX}")
  run("building attn" ${CMAKE_COMMAND} --build "${BUILD_DIR}" ${config_args})
  run("installing attn" ${CMAKE_COMMAND} --install "${BUILD_DIR}" ${config_args})

  # The package is header-only and arch-independent: config files under share/.
  foreach(file include/attn/attn.hpp include/attn/tensor/tensor_view.hpp
               share/cmake/attn/attnConfig.cmake share/cmake/attn/attnConfigVersion.cmake
               share/cmake/attn/attnTargets.cmake)
    if(NOT EXISTS "${PREFIX}/${file}")
      message(FATAL_ERROR "install is missing ${PREFIX}/${file}")
    endif()
  endforeach()
  # The installed package must not point back into the source or build tree.
  file(GLOB config_files "${PREFIX}/share/cmake/attn/*.cmake")
  foreach(file IN LISTS config_files)
    file(READ "${file}" text)
    foreach(tree "${SOURCE_DIR}" "${BUILD_DIR}")
      string(FIND "${text}" "${tree}" at)
      if(NOT at EQUAL -1)
        message(FATAL_ERROR "${file} refers to ${tree}")
      endif()
    endforeach()
  endforeach()
  message(STATUS "attn installed into ${PREFIX}")
  return()
endif()

# find_package with the openmp component (threads), add_subdirectory with attn::attn alone:
# both get the widest kernels without any compile flag (the consumer checks it).
if(STEP STREQUAL "find_package")
  set(mode_options -DATTN_CONSUMER_USE_SUBDIRECTORY=OFF "-DCMAKE_PREFIX_PATH=${PREFIX}"
                   -DATTN_CONSUMER_THREADS=ON)
  set(expected_threads "openmp")
elseif(STEP STREQUAL "add_subdirectory")
  set(mode_options -DATTN_CONSUMER_USE_SUBDIRECTORY=ON "-DATTN_SOURCE_DIR=${SOURCE_DIR}"
                   -DATTN_CONSUMER_THREADS=OFF)
  set(expected_threads "none")
else()
  message(FATAL_ERROR "unknown STEP '${STEP}'")
endif()

run("configuring the consumer" ${CMAKE_COMMAND} -S "${CONSUMER_DIR}" -B "${BUILD_DIR}"
    -G "${GENERATOR}" ${child_options} ${mode_options} "-DCMAKE_CXX_FLAGS=${CHILD_CXX_FLAGS}")

# find_package must have taken attn from the prefix, not from anywhere else.
if(STEP STREQUAL "find_package")
  file(STRINGS "${BUILD_DIR}/CMakeCache.txt" attn_dir REGEX "^attn_DIR:")
  string(REGEX REPLACE "^attn_DIR:[A-Z]+=" "" attn_dir "${attn_dir}")
  if(NOT attn_dir STREQUAL "${PREFIX}/share/cmake/attn")
    message(FATAL_ERROR "find_package(attn) used '${attn_dir}', expected ${PREFIX}/share/cmake/attn")
  endif()
endif()

run("building the consumer" ${CMAKE_COMMAND} --build "${BUILD_DIR}" ${config_args})

set(exe "${BUILD_DIR}/consumer")
if(NOT EXISTS "${exe}")
  set(exe "${BUILD_DIR}/Debug/consumer")  # multi-config generators
endif()
execute_process(COMMAND "${exe}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer exited with ${rc}")
endif()
if(NOT out MATCHES "context has shape \\(2, 6, 4\\)")
  message(FATAL_ERROR "consumer did not report the (2, 6, 4) output")
endif()
if(NOT out MATCHES "threads: ${expected_threads},")
  message(FATAL_ERROR "consumer should report threads: ${expected_threads}")
endif()
