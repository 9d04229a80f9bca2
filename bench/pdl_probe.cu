/* What a dependent kernel launch costs in a replayed CUDA graph, and what programmatic dependent
 * launch (PDL) takes off it (the measurement behind docs/h200-log.md's "The step is power-bound"): 1,000
 * dependent kernels, each a grid-stride pass over a buffer, captured from a stream into a graph
 * and replayed 10 times after 3, in four forms: plain launches of a kernel that does not wait;
 * launches with cudaLaunchAttributeProgrammaticStreamSerialization of a kernel that waits
 * (griddepcontrol.wait) before touching memory; the same kernel also letting its successor be
 * placed once all its blocks have started (griddepcontrol.launch_dependents first); and that
 * kernel launched plainly (the two instructions' own cost). Each line: the graph's dependencies and
 * how many capture made programmatic, and the replay's time a kernel. Three sizes: 16 blocks on 4096
 * floats, 528 on 1 M, 1056 on 8 M. Needs a GPU of compute capability 9.0 or later; not part of the
 * build:
 *   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o /tmp/pdl_probe bench/pdl_probe.cu && /tmp/pdl_probe */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define KERNELS 1000

/* WAIT: griddepcontrol.wait first; TRIGGER: griddepcontrol.launch_dependents before it */
template <bool WAIT, bool TRIGGER> __global__ void k_pass(float *p, int n) {
    if (TRIGGER) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (WAIT) asm volatile("griddepcontrol.wait;" ::: "memory");
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = p[i] * 0.999f + 1.0f;
}

static void check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "pdl_probe: %s: %s\n", what, cudaGetErrorString(e));
    exit(1);
}

static void probe(const char *name, void (*kernel)(float *, int), bool attr, float *p, int n, int blocks) {
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t e;
    cudaEvent_t t0, t1;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
    for (int i = 0; i < KERNELS; i++) {
        cudaLaunchAttribute a;
        a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        a.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t c = {};
        c.gridDim = dim3((unsigned)blocks), c.blockDim = dim3(256), c.stream = s, c.attrs = &a, c.numAttrs = attr;
        check(cudaLaunchKernelEx(&c, kernel, p, n), "launch");
    }
    check(cudaStreamEndCapture(s, &g), "end capture");
    size_t ne = 0;
    check(cudaGraphGetEdges(g, NULL, NULL, NULL, &ne), "edges");
    cudaGraphNode_t *from = (cudaGraphNode_t *)malloc(ne * sizeof *from),
                    *to = (cudaGraphNode_t *)malloc(ne * sizeof *to);
    cudaGraphEdgeData *ed = (cudaGraphEdgeData *)malloc(ne * sizeof *ed);
    if (!from || !to || !ed) exit(1);
    check(cudaGraphGetEdges(g, from, to, ed, &ne), "edges");
    int prog = 0;
    for (size_t i = 0; i < ne; i++) prog += ed[i].type == cudaGraphDependencyTypeProgrammatic;
    check(cudaGraphInstantiate(&e, g, 0), "instantiate");
    check(cudaEventCreate(&t0), "event"), check(cudaEventCreate(&t1), "event");
    for (int r = 0; r < 3; r++) check(cudaGraphLaunch(e, s), "replay");
    check(cudaEventRecord(t0, s), "event");
    for (int r = 0; r < 10; r++) check(cudaGraphLaunch(e, s), "replay");
    check(cudaEventRecord(t1, s), "event");
    check(cudaStreamSynchronize(s), "replays");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, t0, t1), "event time");
    printf("%-26s %8d floats, %4d blocks: %zu dependencies, %4d programmatic; %7.3f us a kernel\n", name, n, blocks, ne,
           prog, ms * 1000.0f / (10.0f * KERNELS));
    free(from), free(to), free(ed);
    cudaEventDestroy(t0), cudaEventDestroy(t1);
    cudaGraphExecDestroy(e), cudaGraphDestroy(g), cudaStreamDestroy(s);
}

int main(void) {
    float *p;
    check(cudaMalloc(&p, 64 << 20), "cudaMalloc");
    check(cudaMemset(p, 0, 64 << 20), "cudaMemset");
    const int sizes[3][2] = {{4096, 16}, {1 << 20, 528}, {8 << 20, 1056}};
    for (int i = 0; i < 3; i++) {
        int n = sizes[i][0], b = sizes[i][1];
        probe("plain, no wait", k_pass<false, false>, false, p, n, b);
        probe("PDL, wait", k_pass<true, false>, true, p, n, b);
        probe("PDL, trigger + wait", k_pass<true, true>, true, p, n, b);
        probe("plain, trigger + wait", k_pass<true, true>, false, p, n, b);
    }
    cudaFree(p);
    return 0;
}
