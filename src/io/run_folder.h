/* keel: the folder a training run writes (--out): one run at a time, no leftovers of killed
 * saves, and the newest complete checkpoint found after any crash. */
#ifndef KEEL_RUN_FOLDER_H
#define KEEL_RUN_FOLDER_H

#include <stddef.h>

/* Locks dir for this process's life: an advisory lock (flock) on dir/keel.lock, which records the
 * holder's pid and host. The kernel drops it when the process ends, however it ends. *fd keeps it;
 * close it to let go. Another live run holding it: -1 with a message naming its pid. */
int keel_run_lock(const char *dir, int *fd);

/* Removes what killed saves left in dir (call with the lock held, so no live run owns them):
 * checkpoint.tmp.* and checkpoint.old.* folders, tokens.cache.tmp.* and metrics.jsonl.tmp.* files, except the path
 * `keep` (a folder being resumed from; NULL: none). *n_removed counts them. -1 naming what could
 * not be removed. */
int keel_run_clean(const char *dir, const char *keep, int *n_removed);

/* Where `--resume dir` continues from: dir itself when it holds trainer_state.json (a checkpoint
 * folder), else dir/checkpoint, else the newest complete checkpoint a swap interrupted between its
 * two renames left in dir (checkpoint.old.*, the largest recorded step). The path goes to out.
 * -1 with a message when dir holds none. */
int keel_resume_locate(const char *dir, char *out, size_t n);

#endif
