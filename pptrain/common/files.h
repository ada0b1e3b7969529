// Whole-file reads and writes with the one-line errors every command gives.
//
//   std::string csv = read_text_file(path, "schedule file");   // "cannot read schedule file 'x'"
//   write_text_file(path, svg, "--svg file");                  // "cannot write --svg file 'x'"
#pragma once

#include <string>

namespace pptrain {

// The file's bytes. UserError "cannot read <what> '<path>'" if it cannot be opened or read (or
// is a folder).
std::string read_text_file(const std::string& path, const std::string& what);

// Replaces the file with `text`. UserError "cannot write <what> '<path>'" if it cannot be opened
// or the write fails (a full disk shows only when the file is closed, so that is checked too).
void write_text_file(const std::string& path, const std::string& text, const std::string& what);

// FNV-1a (64 bits) of `bytes`, as 16 hex digits: a checksum every process computes alike.
std::string digest(const std::string& bytes);

}  // namespace pptrain
