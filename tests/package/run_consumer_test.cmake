# The package_consumer test: install olmax from OLMAX_BUILD_DIR into WORK_DIR/prefix, then configure,
# build and run the project in CONSUMER_SOURCE_DIR against that prefix only.
# Usage: cmake -DOLMAX_BUILD_DIR=... -DWORK_DIR=... -DCONSUMER_SOURCE_DIR=... -DQUICKSTART=...
#              -DEXPECTED_VERSION=... -DGENERATOR=... -DCXX_COMPILER=... -P run_consumer_test.cmake
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${what}:\n${out}${err}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "package_consumer: ${what} failed (${result})")
  endif()
endfunction()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
run_step("install olmax into ${prefix}" "${CMAKE_COMMAND}" --install "${OLMAX_BUILD_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/include/olmax/olmax.hpp")
  message(FATAL_ERROR "package_consumer: the install did not put olmax/olmax.hpp under ${prefix}/include")
endif()
run_step("configure the consumer"
  "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
  -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DOLMAX_EXPECTED_PREFIX=${prefix} -DOLMAX_EXPECTED_VERSION=${EXPECTED_VERSION} -DQUICKSTART=${QUICKSTART})
run_step("build the consumer" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run_step("run the consumer" "${WORK_DIR}/build/olmax_consumer")
