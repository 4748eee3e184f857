// For the fuzz targets whose parser reads a model directory: one private directory per process
// (in /dev/shm when there is one, so nothing touches a disk), and each input written into it as
// the file the parser opens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <fcntl.h>
#include <unistd.h>

namespace flotilla::fuzz {

// The directory, created on first use and removed at exit.
inline const std::string& fuzz_dir() {
  static const std::string dir = [] {
    std::string templ = (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    templ += "/flotilla-fuzz-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) {
      std::abort();
    }
    return templ;
  }();
  return dir;
}

// Replaces DIR/name with `data`; aborts if it cannot (the fuzzer's setup, not a finding).
inline void write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = fuzz_dir() + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::abort();
  }
  for (size_t done = 0; done < size;) {
    const ssize_t wrote = ::write(fd, data + done, size - done);
    if (wrote <= 0) {
      std::abort();
    }
    done += static_cast<size_t>(wrote);
  }
  ::close(fd);
}

// Removes the directory and its files at exit (libFuzzer exits through exit()).
struct RemoveAtExit {
  RemoveAtExit() {
    fuzz_dir();
    std::atexit([] {
      const std::string command = "rm -rf '" + fuzz_dir() + "'";
      if (std::system(command.c_str()) != 0) {
        // Nothing to do: a leftover directory in /dev/shm or /tmp.
      }
    });
  }
};

}  // namespace flotilla::fuzz
