/* A stand-in libcuda.so.1 for the probe tests, compiled by tests/conftest.py. It answers the
 * calls cula's probe makes from what the test puts in the environment:
 *   CULA_STUB_DRIVER_VERSION  e.g. 13000 (cuDriverGetVersion)
 *   CULA_STUB_GPUS            e.g. "NVIDIA H200:9.0,NVIDIA B200:10.0" (empty: no GPU)
 *   CULA_STUB_INIT_ERROR      cuInit's return code (default 0)
 *   CULA_STUB_LOG             file that gets one line "cuInit <pid>" per cuInit call
 *   CULA_STUB_CRASH           when set, cuInit dies with SIGSEGV (a broken driver)
 * CUDA_VISIBLE_DEVICES is honoured as the real driver does for plain ordinals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;

#define MAX_GPUS 16
static char names[MAX_GPUS][128];
static int majors[MAX_GPUS], minors[MAX_GPUS], count = -1;

static void load(void) {
  if (count >= 0) return;
  int all = 0;
  char tmp_names[MAX_GPUS][128];
  int tmp_major[MAX_GPUS], tmp_minor[MAX_GPUS];
  const char* spec = getenv("CULA_STUB_GPUS");
  if (spec && *spec) {
    char buf[2048];
    strncpy(buf, spec, sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    for (char* tok = strtok(buf, ","); tok && all < MAX_GPUS; tok = strtok(NULL, ",")) {
      char* colon = strrchr(tok, ':');
      if (!colon) continue;
      *colon = 0;
      snprintf(tmp_names[all], sizeof tmp_names[all], "%s", tok);
      sscanf(colon + 1, "%d.%d", &tmp_major[all], &tmp_minor[all]);
      ++all;
    }
  }
  count = 0;
  const char* visible = getenv("CUDA_VISIBLE_DEVICES");
  if (!visible) {
    for (int i = 0; i < all; ++i) {
      memcpy(names[count], tmp_names[i], sizeof names[0]);
      majors[count] = tmp_major[i];
      minors[count++] = tmp_minor[i];
    }
    return;
  }
  char buf[256];
  strncpy(buf, visible, sizeof buf - 1);
  buf[sizeof buf - 1] = 0;
  for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    char* end;
    long i = strtol(tok, &end, 10);
    if (*end || i < 0 || i >= all) break; /* the driver stops at the first invalid entry */
    memcpy(names[count], tmp_names[i], sizeof names[0]);
    majors[count] = tmp_major[i];
    minors[count++] = tmp_minor[i];
  }
}

static int initialised = 0;

CUresult cuInit(unsigned flags) {
  (void)flags;
  const char* log = getenv("CULA_STUB_LOG");
  if (log) {
    FILE* f = fopen(log, "a");
    if (f) {
      fprintf(f, "cuInit %d\n", (int)getpid());
      fclose(f);
    }
  }
  if (getenv("CULA_STUB_CRASH")) raise(SIGSEGV);
  const char* err = getenv("CULA_STUB_INIT_ERROR");
  if (err && atoi(err) != 0) return atoi(err);
  initialised = 1;
  return 0;
}

CUresult cuDriverGetVersion(int* v) {
  const char* s = getenv("CULA_STUB_DRIVER_VERSION");
  *v = s ? atoi(s) : 13000;
  return 0;
}

CUresult cuDeviceGetCount(int* n) {
  if (!initialised) return 3; /* CUDA_ERROR_NOT_INITIALIZED */
  load();
  *n = count;
  return 0;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  load();
  if (ordinal < 0 || ordinal >= count) return 101; /* CUDA_ERROR_INVALID_DEVICE */
  *d = ordinal;
  return 0;
}

CUresult cuDeviceGetAttribute(int* value, int attrib, CUdevice d) {
  load();
  if (d < 0 || d >= count) return 101;
  if (attrib == 75) *value = majors[d];
  else if (attrib == 76) *value = minors[d];
  else return 1; /* CUDA_ERROR_INVALID_VALUE */
  return 0;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  load();
  if (d < 0 || d >= count) return 101;
  snprintf(name, (size_t)len, "%s", names[d]);
  return 0;
}

CUresult cuGetErrorName(CUresult rc, const char** s) {
  switch (rc) {
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; return 0;
    case 999: *s = "CUDA_ERROR_UNKNOWN"; return 0;
    case 3: *s = "CUDA_ERROR_NOT_INITIALIZED"; return 0;
    case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; return 0;
    default: return 1;
  }
}
