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

// Replaces the file with `bytes` and has them on the disk (fsync) before it returns: what a
// checkpoint's files need, since a crash after the save must find them whole. When it cannot,
// std::runtime_error (a failure of the run, not of the input): "cannot write <what> '<path>':
// <the system's reason> (<free bytes> free of <size> on its file system)".
void write_file_to_disk(const std::string& path, const std::string& bytes, const std::string& what);

// Flushes a folder's entries (new, renamed or removed files) to the disk; no error when it
// cannot (a file system without the call).
void sync_folder(const std::string& path);

// "1.5 MiB": a byte count for people.
std::string format_bytes(double bytes);

// FNV-1a (64 bits) of `bytes`, as 16 hex digits: a checksum every process computes alike.
std::string digest(const std::string& bytes);

}  // namespace pptrain
