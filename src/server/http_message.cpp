#include "server/http_message.h"

#include <algorithm>
#include <cctype>

namespace tern::server {

bool iequals(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

const std::string& HttpHeaders::get(const std::string& name) const {
  static const std::string kEmpty;
  for (const auto& [k, v] : fields_)
    if (iequals(k, name)) return v;
  return kEmpty;
}

bool HttpHeaders::has(const std::string& name) const { return count(name) > 0; }

size_t HttpHeaders::count(const std::string& name) const {
  return size_t(std::count_if(fields_.begin(), fields_.end(), [&](const auto& f) { return iequals(f.first, name); }));
}

void HttpHeaders::remove(const std::string& name) {
  fields_.erase(std::remove_if(fields_.begin(), fields_.end(), [&](const auto& f) { return iequals(f.first, name); }),
                fields_.end());
}

void HttpHeaders::set(const std::string& name, std::string value) {
  remove(name);
  fields_.emplace_back(name, std::move(value));
}

const char* http_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 300 ? "OK" : status < 500 ? "Bad Request" : "Server Error";
  }
}

}  // namespace tern::server
