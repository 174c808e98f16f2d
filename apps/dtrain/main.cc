#include "dtrain/cli.h"

int main(int argc, char** argv) {
  return dtrain::cli_main(argc, argv);
}
