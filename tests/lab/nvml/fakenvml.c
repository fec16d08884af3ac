/*
 * The lab's libnvidia-ml.so.1: a stand-in for NVIDIA's NVML that the real pynvml
 * (nvidia-ml-py) and the lab's nvidia-smi load with dlopen.
 *
 * Where the values come from
 *   A key=value file, /var/lib/kpro-lab/nvml.conf (or $FAKE_NVML_CONFIG), rendered from
 *   the lab state by tests/lab/rootfs/usr/lib/kpro-lab/nvml_render.py after every state
 *   change. It is re-read on every call, so memory and processes are live (the SGLang
 *   stand-in changes them while a program holds an NVML handle).
 *
 * The library's own version
 *   Like the real one, this library *is* one version: the installer stand-in installs it
 *   as libnvidia-ml.so.<version> with the libnvidia-ml.so.1 symlink, and the library
 *   takes its version from its own file name (dladdr + realpath). If the name carries no
 *   version, the compile-time default FAKE_NVML_VERSION is used.
 *
 * Semantics (as the real library):
 *   - no config file, or driver_loaded=0 (the nvidia kernel module is not loaded):
 *     nvmlInit -> NVML_ERROR_DRIVER_NOT_LOADED (9);
 *   - kernel_module_version != the library's version (userspace and kernel module from
 *     different driver releases, "NVRM: API mismatch"): nvmlInit ->
 *     NVML_ERROR_LIB_RM_VERSION_MISMATCH (18), "Driver/library version mismatch";
 *   - devices are the GPUs bound to the nvidia driver, in NVML index order;
 *   - process PIDs are the ones in the state (host PIDs, as NVML reports inside LXC).
 *
 * Build: gcc -shared -fPIC -O2 -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fakenvml.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FAKE_NVML_VERSION
#define FAKE_NVML_VERSION "580.126.09"
#endif
#define DEFAULT_CONFIG "/var/lib/kpro-lab/nvml.conf"

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_LIB_RM_VERSION_MISMATCH 18
#define NVML_ERROR_UNKNOWN 999
#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu

#define MAXDEV 16
#define MAXPROC 64

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
  char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32];
} nvmlPciInfo_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
  unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

struct fakeproc { unsigned int pid; unsigned long long used; char name[256]; };
struct fakedev {
  int index; char name[96]; char uuid[96]; char busid[32];
  unsigned long long mem_total, mem_reserved, mem_used;
  unsigned int pci_device_id, pci_subsys_id, minor, persistence_mode;
  unsigned int temp, util_gpu, util_mem, power_mw, power_limit_mw, fan, pstate; int cc_major, cc_minor;
  unsigned long long throttle_reasons, ecc_corrected, ecc_uncorrected;
  unsigned int nproc; struct fakeproc procs[MAXPROC];
};
typedef struct fakedev *nvmlDevice_t;

static struct fakedev devs[MAXDEV];
static unsigned int ndev = 0;
static int init_count = 0;
static int driver_loaded = 0;
static char kernel_version[80] = "";
static int cuda_version = 13000;
static char lib_version[80] = "";

/* The library's version: from its own file name, libnvidia-ml.so.<version>. */
const char *kpro_lab_nvml_library_version(void) {
  if (lib_version[0]) return lib_version;
  snprintf(lib_version, sizeof lib_version, "%s", FAKE_NVML_VERSION);
  Dl_info info;
  char real[PATH_MAX];
  if (dladdr((void *)kpro_lab_nvml_library_version, &info) && info.dli_fname && realpath(info.dli_fname, real)) {
    const char *base = strrchr(real, '/');
    base = base ? base + 1 : real;
    const char *pfx = "libnvidia-ml.so.";
    if (!strncmp(base, pfx, strlen(pfx))) {
      const char *v = base + strlen(pfx);
      if (strchr(v, '.')) snprintf(lib_version, sizeof lib_version, "%s", v);
    }
  }
  return lib_version;
}

static void set(const char *k, const char *v) {
  if (!strcmp(k, "driver_loaded")) { driver_loaded = atoi(v); return; }
  if (!strcmp(k, "kernel_module_version")) { snprintf(kernel_version, sizeof kernel_version, "%s", v); return; }
  if (!strcmp(k, "cuda_driver_version")) { cuda_version = atoi(v); return; }
  if (!strcmp(k, "device_count")) { ndev = (unsigned)atoi(v); if (ndev > MAXDEV) ndev = MAXDEV; return; }
  unsigned i, j; char f[64];
  if (sscanf(k, "gpu%u.proc%u.%63s", &i, &j, f) == 3 && i < MAXDEV && j < MAXPROC) {
    struct fakeproc *p = &devs[i].procs[j];
    if (!strcmp(f, "pid")) p->pid = (unsigned)strtoul(v, 0, 0);
    else if (!strcmp(f, "used")) p->used = strtoull(v, 0, 0);
    else if (!strcmp(f, "name")) snprintf(p->name, sizeof p->name, "%s", v);
    return;
  }
  if (sscanf(k, "gpu%u.%63s", &i, f) == 2 && i < MAXDEV) {
    struct fakedev *d = &devs[i];
    if (!strcmp(f, "name")) snprintf(d->name, sizeof d->name, "%s", v);
    else if (!strcmp(f, "uuid")) snprintf(d->uuid, sizeof d->uuid, "%s", v);
    else if (!strcmp(f, "pci_bus_id")) snprintf(d->busid, sizeof d->busid, "%s", v);
    else if (!strcmp(f, "mem_total")) d->mem_total = strtoull(v, 0, 0);
    else if (!strcmp(f, "mem_reserved")) d->mem_reserved = strtoull(v, 0, 0);
    else if (!strcmp(f, "mem_used")) d->mem_used = strtoull(v, 0, 0);
    else if (!strcmp(f, "pci_device_id")) d->pci_device_id = (unsigned)strtoul(v, 0, 0);
    else if (!strcmp(f, "pci_subsys_id")) d->pci_subsys_id = (unsigned)strtoul(v, 0, 0);
    else if (!strcmp(f, "minor")) d->minor = (unsigned)atoi(v);
    else if (!strcmp(f, "persistence_mode")) d->persistence_mode = (unsigned)atoi(v);
    else if (!strcmp(f, "temp")) d->temp = (unsigned)atoi(v);
    else if (!strcmp(f, "util_gpu")) d->util_gpu = (unsigned)atoi(v);
    else if (!strcmp(f, "util_mem")) d->util_mem = (unsigned)atoi(v);
    else if (!strcmp(f, "power_mw")) d->power_mw = (unsigned)atoi(v);
    else if (!strcmp(f, "power_limit_mw")) d->power_limit_mw = (unsigned)atoi(v);
    else if (!strcmp(f, "fan")) d->fan = (unsigned)atoi(v);
    else if (!strcmp(f, "pstate")) d->pstate = (unsigned)atoi(v);
    else if (!strcmp(f, "throttle_reasons")) d->throttle_reasons = strtoull(v, 0, 0);
    else if (!strcmp(f, "ecc_corrected")) d->ecc_corrected = strtoull(v, 0, 0);
    else if (!strcmp(f, "ecc_uncorrected")) d->ecc_uncorrected = strtoull(v, 0, 0);
    else if (!strcmp(f, "nproc")) { d->nproc = (unsigned)atoi(v); if (d->nproc > MAXPROC) d->nproc = MAXPROC; }
    else if (!strcmp(f, "cc")) sscanf(v, "%d.%d", &d->cc_major, &d->cc_minor);
  }
}

/* Read the config; returns 0 on success, -1 when there is none. */
static int readconf(void) {
  const char *path = getenv("FAKE_NVML_CONFIG");
  if (!path || !path[0]) path = DEFAULT_CONFIG;
  FILE *fp = fopen(path, "r");
  if (!fp) return -1;
  memset(devs, 0, sizeof devs); ndev = 0; driver_loaded = 0; kernel_version[0] = 0; cuda_version = 13000;
  char line[1024];
  while (fgets(line, sizeof line, fp)) {
    line[strcspn(line, "\r\n")] = 0;
    if (line[0] == '#' || !line[0]) continue;
    char *eq = strchr(line, '='); if (!eq) continue;
    *eq = 0; set(line, eq + 1);
  }
  fclose(fp);
  for (unsigned i = 0; i < MAXDEV; i++) devs[i].index = (int)i;
  return 0;
}

static nvmlReturn_t load(void) {
  if (readconf() || !driver_loaded) return NVML_ERROR_DRIVER_NOT_LOADED;
  if (strcmp(kernel_version, kpro_lab_nvml_library_version())) return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
  init_count++;
  return NVML_SUCCESS;
}

/* Every query re-reads the state: memory and processes change under a held handle. */
static nvmlReturn_t refresh(void) {
  if (!init_count) return NVML_ERROR_UNINITIALIZED;
  if (readconf() || !driver_loaded) return NVML_ERROR_DRIVER_NOT_LOADED;
  return NVML_SUCCESS;
}

#define NEED_INIT do { nvmlReturn_t _r = refresh(); if (_r) return _r; } while (0)
#define DEV_OK(d) do { \
    if (!(d) || (d) < devs || (d) >= devs + MAXDEV) return NVML_ERROR_INVALID_ARGUMENT; \
    if ((d) >= devs + ndev) return NVML_ERROR_GPU_IS_LOST; } while (0)
#define ARG(p) do { if (!(p)) return NVML_ERROR_INVALID_ARGUMENT; } while (0)

static nvmlReturn_t copystr(char *dst, unsigned int len, const char *src) {
  if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
  if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
  strcpy(dst, src); return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return load(); }
nvmlReturn_t nvmlInit(void) { return load(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return load(); }
nvmlReturn_t nvmlShutdown(void) {
  if (!init_count) return NVML_ERROR_UNINITIALIZED;
  init_count--; return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    default: return "Unknown Error";
  }
}

/* System queries. */
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { NEED_INIT; return copystr(v, n, kernel_version); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int n) {
  char buf[96];
  NEED_INIT;
  snprintf(buf, sizeof buf, "%d.%s", cuda_version / 1000, kpro_lab_nvml_library_version());
  return copystr(v, n, buf);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { NEED_INIT; ARG(v); *v = cuda_version; return NVML_SUCCESS; }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }
nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int len) {
  NEED_INIT; ARG(name);
  for (unsigned i = 0; i < ndev; i++)
    for (unsigned j = 0; j < devs[i].nproc; j++)
      if (devs[i].procs[j].pid == pid) {
        if (!len) return NVML_ERROR_INVALID_ARGUMENT;
        snprintf(name, len, "%s", devs[i].procs[j].name);
        return NVML_SUCCESS;
      }
  return NVML_ERROR_NOT_FOUND;
}

/* Device enumeration. */
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *c) { NEED_INIT; ARG(c); *c = ndev; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *c) { return nvmlDeviceGetCount_v2(c); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *h) {
  NEED_INIT; if (!h || i >= ndev) return NVML_ERROR_INVALID_ARGUMENT; *h = &devs[i]; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *h) { return nvmlDeviceGetHandleByIndex_v2(i, h); }
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *h) {
  NEED_INIT; ARG(uuid); ARG(h);
  for (unsigned i = 0; i < ndev; i++) if (!strcmp(devs[i].uuid, uuid)) { *h = &devs[i]; return NVML_SUCCESS; }
  return NVML_ERROR_NOT_FOUND;
}
static int same_bus_id(const char *a, const char *b) {
  unsigned d1, b1, s1, f1, d2, b2, s2, f2;
  if (sscanf(a, "%x:%x:%x.%x", &d1, &b1, &s1, &f1) != 4) {
    d1 = 0; if (sscanf(a, "%x:%x.%x", &b1, &s1, &f1) != 3) return 0;
  }
  if (sscanf(b, "%x:%x:%x.%x", &d2, &b2, &s2, &f2) != 4) return 0;
  return d1 == d2 && b1 == b2 && s1 == s2 && f1 == f2;
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *h) {
  NEED_INIT; ARG(bus); ARG(h);
  for (unsigned i = 0; i < ndev; i++) if (same_bus_id(bus, devs[i].busid)) { *h = &devs[i]; return NVML_SUCCESS; }
  return NVML_ERROR_NOT_FOUND;
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, nvmlDevice_t *h) { return nvmlDeviceGetHandleByPciBusId_v2(bus, h); }

/* Device attributes. */
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) { NEED_INIT; DEV_OK(d); ARG(i); *i = (unsigned)d->index; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *n, unsigned int len) { NEED_INIT; DEV_OK(d); return copystr(n, len, d->name); }
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *u, unsigned int len) { NEED_INIT; DEV_OK(d); return copystr(u, len, d->uuid); }
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m) { NEED_INIT; DEV_OK(d); ARG(m); *m = d->minor; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, int *mode) {
  NEED_INIT; DEV_OK(d); ARG(mode); *mode = d->persistence_mode ? 1 : 0; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
  NEED_INIT; DEV_OK(d); ARG(m);
  m->total = d->mem_total; m->used = d->mem_used;
  m->free = d->mem_total > d->mem_used ? d->mem_total - d->mem_used : 0;
  return NVML_SUCCESS;
}
/* v2 splits the driver's reservation out of "used": total = reserved + used + free. */
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
  NEED_INIT; DEV_OK(d); ARG(m);
  unsigned long long res = d->mem_reserved < d->mem_used ? d->mem_reserved : d->mem_used;
  m->total = d->mem_total; m->reserved = res; m->used = d->mem_used - res;
  m->free = d->mem_total > d->mem_used ? d->mem_total - d->mem_used : 0;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
  NEED_INIT; DEV_OK(d); ARG(p);
  memset(p, 0, sizeof *p);
  snprintf(p->busId, sizeof p->busId, "%s", d->busid);
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  sscanf(d->busid, "%x:%x:%x.%x", &dom, &bus, &dev, &fn);
  snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04X:%02X:%02X.%X", dom & 0xffff, bus, dev, fn);
  p->domain = dom; p->bus = bus; p->device = dev;
  p->pciDeviceId = d->pci_device_id; p->pciSubSystemId = d->pci_subsys_id;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
  (void)sensor; NEED_INIT; DEV_OK(d); ARG(t); *t = d->temp; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
  NEED_INIT; DEV_OK(d); ARG(u); u->gpu = d->util_gpu; u->memory = d->util_mem; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *maj, int *min) {
  NEED_INIT; DEV_OK(d); ARG(maj); ARG(min); *maj = d->cc_major; *min = d->cc_minor; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *p) { NEED_INIT; DEV_OK(d); ARG(p); *p = d->power_mw; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *p) {
  NEED_INIT; DEV_OK(d); ARG(p); *p = d->power_limit_mw; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *p) { return nvmlDeviceGetEnforcedPowerLimit(d, p); }
nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t d, unsigned int *s) { NEED_INIT; DEV_OK(d); ARG(s); *s = d->fan; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t d, int *s) { NEED_INIT; DEV_OK(d); ARG(s); *s = (int)d->pstate; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, int *m) { NEED_INIT; DEV_OK(d); ARG(m); *m = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t d, int *a) { NEED_INIT; DEV_OK(d); ARG(a); *a = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t d, int *a) { NEED_INIT; DEV_OK(d); ARG(a); *a = 0; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pend) {
  (void)cur; (void)pend; NEED_INIT; DEV_OK(d); return NVML_ERROR_NOT_SUPPORTED;  /* A6000: no MIG */
}

/* Health (nvidia-ml-py 13.615 pynvml.py: nvmlDeviceGetCurrentClocksThrottleReasons(handle) passes one unsigned long long*,
 * nvmlDeviceGetCurrentClocksEventReasons its newer name; nvmlDeviceGetTotalEccErrors(handle, errorType, counterType)
 * with NVML_MEMORY_ERROR_TYPE_CORRECTED 0 / UNCORRECTED 1 and NVML_VOLATILE_ECC 0 / NVML_AGGREGATE_ECC 1). The lab keeps
 * one count per error type for both counters; the state's throttle_reasons is the nvmlClocksThrottleReason* bitmask. */
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) {
  NEED_INIT; DEV_OK(d); ARG(r); *r = d->throttle_reasons; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *r) {
  return nvmlDeviceGetCurrentClocksThrottleReasons(d, r);
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int errorType, int counterType, unsigned long long *n) {
  NEED_INIT; DEV_OK(d); ARG(n);
  if ((errorType != 0 && errorType != 1) || (counterType != 0 && counterType != 1)) return NVML_ERROR_INVALID_ARGUMENT;
  *n = errorType ? d->ecc_uncorrected : d->ecc_corrected; return NVML_SUCCESS;
}

/* Running processes: the first call with a too small buffer reports the count. */
static nvmlReturn_t procs(nvmlDevice_t d, unsigned int *count, void *infos, int ver) {
  NEED_INIT; DEV_OK(d); ARG(count);
  unsigned n = d->nproc;
  if (!n) { *count = 0; return NVML_SUCCESS; }
  if (!infos || *count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
  for (unsigned j = 0; j < n; j++) {
    if (ver == 1) {
      nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + j;
      p->pid = d->procs[j].pid; p->usedGpuMemory = d->procs[j].used;
    } else {
      nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + j;
      p->pid = d->procs[j].pid; p->usedGpuMemory = d->procs[j].used;
      p->gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT; p->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
    }
  }
  *count = n;
  return NVML_SUCCESS;
}
static nvmlReturn_t noprocs(nvmlDevice_t d, unsigned int *count) { NEED_INIT; DEV_OK(d); ARG(count); *count = 0; return NVML_SUCCESS; }

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *i) { return procs(d, c, i, 3); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *i) { return procs(d, c, i, 2); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *i) { return procs(d, c, i, 1); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i) { (void)i; return noprocs(d, c); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i) { (void)i; return noprocs(d, c); }
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i) { (void)i; return noprocs(d, c); }
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i) { (void)i; return noprocs(d, c); }
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i) { (void)i; return noprocs(d, c); }
