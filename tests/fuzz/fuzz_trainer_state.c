/* libFuzzer target: trainer_state.json, as `keel train --resume DIR` reads it: the recorded
 * options (each checked as its flag would be) and the counters (step, position, tokens and the
 * settings a resumed run must keep). Every input is taken or refused without a crash. */
#include "fuzz_util.h"

#include <sys/stat.h>

#include "train/options.h"
#include "train/trainer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[128], out[160];
    snprintf(dir, sizeof dir, "%s/ck", fuzz_folder());
    snprintf(out, sizeof out, "%s/out", fuzz_folder());
    mkdir(dir, 0755);
    fuzz_file("ck/trainer_state.json", data, size);
    char *argv[] = {"train", "--resume", dir, "--out", out, NULL};
    keel_train_opts o;
    if (keel_train_parse(5, argv, &o) == 0) {
        trainer t = {.o = &o, .world = 1, .lock_fd = -1};
        keel_trainer_read_state(&t, dir); /* the counters; then it stops at the missing optimizer state */
    }
    keel_train_opts_release();
    return 0;
}
