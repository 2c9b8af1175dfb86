# tests/codegen/prefetch_kept.cmake: compiles tests/codegen/prefetch_kept.cpp to assembly at
# -O2, once per probe, and fails unless each probe's code holds a prefetch instruction (see the
# source for why). Run by ctest as attn.codegen.prefetch_kept:
#   cmake -DCOMPILER=<c++> -DSOURCE=<prefetch_kept.cpp> -DINCLUDE_DIR=<include> -DWORK_DIR=<dir>
#         -P prefetch_kept.cmake
foreach(_probe 1 2 3)
  set(_asm ${WORK_DIR}/prefetch_kept_${_probe}.s)
  execute_process(
    COMMAND ${COMPILER} -std=c++17 -O2 -I${INCLUDE_DIR} -DATTN_PROBE=${_probe} -S -o ${_asm}
            ${SOURCE}
    RESULT_VARIABLE _status ERROR_VARIABLE _errors)
  if(NOT _status EQUAL 0)
    message(FATAL_ERROR "probe ${_probe} did not compile:\n${_errors}")
  endif()
  file(STRINGS ${_asm} _prefetches REGEX "^[ \t]+prefetch")
  list(LENGTH _prefetches _count)
  if(_count EQUAL 0)
    message(FATAL_ERROR "probe ${_probe}: no prefetch instruction in ${_asm} (the compiler "
                        "deleted the requests)")
  endif()
  message(STATUS "probe ${_probe}: ${_count} prefetch instruction(s)")
endforeach()
