#include "cli.h"
int cmd_demo(int argc, char **argv) { (void)argc; (void)argv; return 1; }
