# Run at every build (cmake -DSRC=source-dir -DOUT=header -P git_commit.cmake): writes
#   #define PTQKIT_GIT_COMMIT "<12 hex digits of HEAD>[-dirty]"   ("unknown" outside a git checkout)
# into OUT, rewriting it only when the text changes, so that only a new commit (or a tree turning
# dirty or clean) recompiles lib/core/build_info.cpp. "-dirty": tracked files differ from HEAD.
execute_process(COMMAND git -C "${SRC}" rev-parse --short=12 HEAD
                OUTPUT_VARIABLE commit RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
else()
  execute_process(COMMAND git -C "${SRC}" status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE changes RESULT_VARIABLE rc ERROR_QUIET)
  if(rc EQUAL 0 AND NOT changes STREQUAL "")
    set(commit "${commit}-dirty")
  endif()
endif()
set(text "#define PTQKIT_GIT_COMMIT \"${commit}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
