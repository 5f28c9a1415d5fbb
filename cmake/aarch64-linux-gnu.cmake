# Cross build for ARM64 Linux with Debian's g++-aarch64-linux-gnu (cmake --preset aarch64). The
# arm64 builds of the libraries tern links (cpp-httplib and what it needs, GoogleTest) come from
# Debian's multiarch packages (scripts/install-deps.sh --aarch64); the test binaries run under
# qemu-user (CMAKE_CROSSCOMPILING_EMULATOR), so ctest and test discovery work on an x86 host.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# No -L /usr/aarch64-linux-gnu: the binaries load the multiarch arm64 glibc (libc6:arm64, in
# /lib/aarch64-linux-gnu, the same as the libraries linked from there); mixing it with the
# cross toolchain's own copy under -L hangs the first pthread_create under qemu.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
# Headers-only packages (nlohmann-json, CLI11) are found in the host's /usr; libraries in the
# arm64 multiarch directories only.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
