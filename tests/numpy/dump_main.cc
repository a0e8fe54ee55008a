// attn_numpy_dump <dir>: writes every registered op's cross-check cases under <dir>.
#include <iostream>

#include "tests/numpy/dump.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: attn_numpy_dump <dir>\n";
    return 2;
  }
  for (const auto& [op, dumper] : attnd::testing::NumpyDumpers()) {
    std::cout << "dumping " << op << "\n";
    dumper(argv[1]);
  }
  return 0;
}
