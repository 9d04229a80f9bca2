/* keel: activation recompute. Rewrites a training graph (forward + backward) so that backward
 * reads recomputed clones of forward activations instead of the originals, from the nearest
 * checkpoint; the memory plan then frees each original after its last forward use. A clone is the
 * same op with the same parameters on the same input values, so it produces the same bits: loss
 * and gradients are bitwise equal in every mode. */
#ifndef KEEL_RECOMPUTE_H
#define KEEL_RECOMPUTE_H

#include "graph/graph.h"

#define KEEL_RECOMPUTE_MAX_LAYERS 256

typedef enum { KEEL_RC_OFF, KEEL_RC_FULL, KEEL_RC_EVERY, KEEL_RC_LAYERS } keel_rc_kind;

typedef struct {
    keel_rc_kind kind;
    int every;                                 /* every:N */
    uint8_t layers[KEEL_RECOMPUTE_MAX_LAYERS]; /* layers:i,j,... */
    char text[64];
} keel_recompute_mode;

/* "off", "full", "every:N", "layers:i,j,..."; -1 with a message otherwise. */
int keel_recompute_parse(const char *s, keel_recompute_mode *m);

/* Where each layer's nodes are: ids [first_id[i], end_id[i]) were created by layer i, and
 * boundary[i] is the tensor entering layer i (boundary[n_layers] leaves the last one). */
typedef struct {
    int n_layers;
    int64_t first_id[KEEL_RECOMPUTE_MAX_LAYERS], end_id[KEEL_RECOMPUTE_MAX_LAYERS];
    keel_tensor *boundary[KEEL_RECOMPUTE_MAX_LAYERS + 1];
} keel_layer_map;

/* Rewrites g (after keel_build_backward). Returns the number of clones made, or -1. */
int64_t keel_recompute_apply(keel_graph *g, const keel_layer_map *lm, const keel_recompute_mode *m);

#endif
