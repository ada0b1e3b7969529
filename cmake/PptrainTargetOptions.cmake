# Compiler settings that belong to each target, never to a whole directory:
#   pptrain_set_warnings(target)    -Wall -Wextra; -Werror with PPTRAIN_WERROR=ON
#   pptrain_set_sanitizers(target)  the sanitizers named in PPTRAIN_SANITIZE
#   pptrain_target_defaults(target) both; every target of this project calls it

# PPTRAIN_SANITIZE is checked once, at configure time, so a typo fails before anything builds.
set(PPTRAIN_SANITIZE_FLAGS "")
if(PPTRAIN_SANITIZE)
  string(REPLACE "," ";" _pptrain_sanitizers "${PPTRAIN_SANITIZE}")
  foreach(_sanitizer IN LISTS _pptrain_sanitizers)
    string(STRIP "${_sanitizer}" _sanitizer)
    if(NOT _sanitizer MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "PPTRAIN_SANITIZE: unknown sanitizer '${_sanitizer}' in "
                          "'${PPTRAIN_SANITIZE}'; expected address, undefined or thread, "
                          "comma separated (e.g. -DPPTRAIN_SANITIZE=address,undefined)")
    endif()
    list(APPEND PPTRAIN_SANITIZE_FLAGS "-fsanitize=${_sanitizer}")
  endforeach()
  if("-fsanitize=address" IN_LIST PPTRAIN_SANITIZE_FLAGS
     AND "-fsanitize=thread" IN_LIST PPTRAIN_SANITIZE_FLAGS)
    message(FATAL_ERROR "PPTRAIN_SANITIZE: address and thread cannot be combined "
                        "(got '${PPTRAIN_SANITIZE}')")
  endif()
  list(REMOVE_DUPLICATES PPTRAIN_SANITIZE_FLAGS)
endif()

function(pptrain_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(PPTRAIN_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# The link flag is PUBLIC: whatever links an instrumented static library needs the sanitizer's
# runtime, in this build and in a project that installs it.
function(pptrain_set_sanitizers target)
  if(PPTRAIN_SANITIZE_FLAGS)
    target_compile_options(${target} PRIVATE ${PPTRAIN_SANITIZE_FLAGS} -fno-omit-frame-pointer)
    target_link_options(${target} PUBLIC ${PPTRAIN_SANITIZE_FLAGS})
  endif()
endfunction()

function(pptrain_target_defaults target)
  pptrain_set_warnings(${target})
  pptrain_set_sanitizers(${target})
endfunction()
