#pragma once
// The chat page's files (web/ in the source tree), compiled into the binary by
// cmake/embed_web.cmake so an installed `tern serve` needs no files beside it.
#include <cstddef>
#include <span>

namespace tern::server {

struct WebAsset {
  const char* path;  // URL path: "/index.html", "/app.js", ...
  const char* mime;  // Content-Type
  const unsigned char* data;
  size_t size;
};

// Every embedded file (generated source).
std::span<const WebAsset> web_assets();

}  // namespace tern::server
