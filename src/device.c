/* src/device.c: Device.
 * Owns: forge__device (the Vulkan loader, instance, physical and logical device, queue),
 * forge__caps, buffers and their packing into allocations.
 * May call: base.c.
 *
 * Vulkan is loaded at run time (libvulkan.so.1), so a machine without a loader gets an error
 * instead of a program that cannot start. One forge__device per model: instance, physical
 * device, logical device, one compute queue, and the capabilities read once. Buffers never
 * exceed the device's limits and are always bound with explicit ranges.
 */

#include <dlfcn.h>

#define FORGE__VK_INSTANCE_FNS(X)                                                                  \
    X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties)             \
    X(vkGetPhysicalDeviceProperties2) X(vkGetPhysicalDeviceFeatures2)                                \
    X(vkGetPhysicalDeviceMemoryProperties) X(vkGetPhysicalDeviceQueueFamilyProperties)              \
    X(vkEnumerateDeviceExtensionProperties) X(vkCreateDevice) X(vkGetDeviceProcAddr)                \
    X(vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)

#define FORGE__VK_DEVICE_FNS(X)                                                                     \
    X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkCreateBuffer) X(vkDestroyBuffer)                      \
    X(vkGetBufferMemoryRequirements) X(vkAllocateMemory) X(vkFreeMemory) X(vkBindBufferMemory)       \
    X(vkMapMemory) X(vkUnmapMemory) X(vkInvalidateMappedMemoryRanges) X(vkFlushMappedMemoryRanges)  \
    X(vkCreateShaderModule) X(vkDestroyShaderModule) X(vkCreateDescriptorSetLayout)                 \
    X(vkDestroyDescriptorSetLayout) X(vkCreatePipelineLayout) X(vkDestroyPipelineLayout)            \
    X(vkCreateComputePipelines) X(vkDestroyPipeline) X(vkCreateDescriptorPool)                      \
    X(vkDestroyDescriptorPool) X(vkResetDescriptorPool) X(vkAllocateDescriptorSets)                 \
    X(vkUpdateDescriptorSets) X(vkCreateCommandPool) X(vkDestroyCommandPool)                        \
    X(vkAllocateCommandBuffers) X(vkFreeCommandBuffers) X(vkBeginCommandBuffer)                     \
    X(vkEndCommandBuffer) X(vkCmdBindPipeline) X(vkCmdBindDescriptorSets) X(vkCmdPushConstants)     \
    X(vkCmdDispatch) X(vkCmdPipelineBarrier) X(vkCmdCopyBuffer) X(vkCmdFillBuffer)                  \
    X(vkQueueSubmit) X(vkCreateFence) X(vkDestroyFence) X(vkWaitForFences) X(vkResetFences)         \
    X(vkDeviceWaitIdle) X(vkCreateQueryPool) X(vkDestroyQueryPool) X(vkCmdResetQueryPool)           \
    X(vkCmdWriteTimestamp) X(vkGetQueryPoolResults)

typedef struct forge__vkfn {
    void *lib;
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
    PFN_vkCreateInstance vkCreateInstance;
    PFN_vkEnumerateInstanceVersion vkEnumerateInstanceVersion;
#define FORGE__VK_DECL(name) PFN_##name name;
    FORGE__VK_INSTANCE_FNS(FORGE__VK_DECL)
    FORGE__VK_DEVICE_FNS(FORGE__VK_DECL)
#undef FORGE__VK_DECL
} forge__vkfn;

/* What forge knows about a device, read once. */
typedef struct forge__caps {
    VkPhysicalDeviceProperties props;
    forge_device_type type;
    uint64_t max_storage_range;   /* the binding limit forge honours (maybe lowered by params) */
    uint64_t max_alloc;           /* the largest allocation forge makes (maybe lowered) */
    uint64_t max_buffer_size;
    uint64_t storage_align;       /* minStorageBufferOffsetAlignment */
    uint32_t subgroup_size;
    uint32_t max_shared_bytes;
    uint32_t max_wg_invocations;
    bool fp16, int8, coopmat;
    bool int_dot;                 /* VK_KHR_shader_integer_dot_product offered and its feature on: matvec_q8a */
    bool has_nv_coopmat_ext;      /* VK_NV_cooperative_matrix is offered */
    bool coopmat_nv;              /* ... and enabled with fp16 16x16x16 -> fp32 on 32-wide subgroups: matmul_cm */
    bool subgroup_arith;          /* subgroupAdd in compute shaders: the barrier-free matvec */
    bool subgroup_shuffle;        /* subgroupShuffleXor in compute shaders, subgroups of 8 or more: delta_rule_sg */
    bool uma;                     /* device-local memory is host-visible (CPU and integrated devices) */
    uint64_t device_local_bytes;
    uint32_t queue_family;
    bool timestamps;              /* the compute queue supports timestamps (profiling) */
    uint32_t mem_device;          /* memory type index for weights and activations */
    uint32_t mem_upload;          /* host-visible, coherent: staging and per-step inputs */
    uint32_t mem_readback;        /* host-visible, cached if possible: logits */
    uint32_t mem_step;            /* host-visible and coherent, device-local if possible: the per-step inputs that kernels
                                   * read (position, tokens, penalty window), which in system memory every attention_decode
                                   * workgroup fetched over PCIe before anything else */
    bool readback_coherent;
} forge__caps;

typedef struct forge__device {
    forge__vkfn vk;
    VkInstance instance;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    pthread_mutex_t queue_lock;   /* the model is shared between threads; its queue is not */
    forge__caps caps;
    forge_device_info info;
} forge__device;

/* A device buffer with its own memory. `mapped` is set for host-visible memory. */
typedef struct forge__buffer {
    VkBuffer buf;
    VkDeviceMemory mem;
    uint64_t size;
    void *mapped;
} forge__buffer;

/* A binding: buffer + explicit offset and range, never VK_WHOLE_SIZE. */
typedef struct forge__range {
    VkBuffer buf;
    uint64_t offset, size;
} forge__range;

static forge_status forge__vk_load(forge__vkfn *vk, forge__err *err) {
    memset(vk, 0, sizeof *vk);
    const char *names[] = {"libvulkan.so.1", "libvulkan.so", "libvulkan.1.dylib", "libMoltenVK.dylib"};
    for (size_t i = 0; i < FORGE__ARRAY_LEN(names) && !vk->lib; i++) vk->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!vk->lib) return forge__fail(err, FORGE_ERR_DEVICE, "no Vulkan loader found (libvulkan.so.1): install libvulkan1 and a driver (mesa-vulkan-drivers for the CPU)");
    vk->vkGetInstanceProcAddr = (PFN_vkGetInstanceProcAddr)dlsym(vk->lib, "vkGetInstanceProcAddr");
    if (!vk->vkGetInstanceProcAddr) {
        dlclose(vk->lib);
        vk->lib = NULL;
        return forge__fail(err, FORGE_ERR_DEVICE, "the Vulkan loader lacks vkGetInstanceProcAddr");
    }
    vk->vkCreateInstance = (PFN_vkCreateInstance)vk->vkGetInstanceProcAddr(NULL, "vkCreateInstance");
    vk->vkEnumerateInstanceVersion =
        (PFN_vkEnumerateInstanceVersion)vk->vkGetInstanceProcAddr(NULL, "vkEnumerateInstanceVersion");
    return FORGE_OK;
}

static forge_status forge__vk_instance(forge__vkfn *vk, VkInstance *out, forge__err *err) {
    uint32_t version = VK_API_VERSION_1_0;
    if (vk->vkEnumerateInstanceVersion) vk->vkEnumerateInstanceVersion(&version);
    if (version < VK_API_VERSION_1_2)
        return forge__fail(err, FORGE_ERR_DEVICE, "the Vulkan loader supports %u.%u; forge needs 1.2",
                           VK_API_VERSION_MAJOR(version), VK_API_VERSION_MINOR(version));
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "forge",
                             .pEngineName = "forge", .apiVersion = VK_API_VERSION_1_2};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkResult r = vk->vkCreateInstance(&ci, NULL, out);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkCreateInstance failed (VkResult %d)", (int)r);
#define FORGE__VK_LOAD(name) vk->name = (PFN_##name)vk->vkGetInstanceProcAddr(*out, #name);
    FORGE__VK_INSTANCE_FNS(FORGE__VK_LOAD)
#undef FORGE__VK_LOAD
    return FORGE_OK;
}

static bool forge__has_ext(const VkExtensionProperties *exts, uint32_t n, const char *name) {
    for (uint32_t i = 0; i < n; i++)
        if (!strcmp(exts[i].extensionName, name)) return true;
    return false;
}

static int forge__type_rank(forge_device_type t) {
    switch (t) {
    case FORGE_DEVICE_DISCRETE_GPU: return 0;
    case FORGE_DEVICE_INTEGRATED_GPU: return 1;
    case FORGE_DEVICE_VIRTUAL_GPU: return 2;
    case FORGE_DEVICE_CPU: return 3;
    default: return 4;
    }
}

/* Whether the device can run attention_decode.comp: subgroup arithmetic at a width of 4 to 64
 * (its workgroup of 64 holds 64 / width subgroups) and its 13 storage buffers (Vulkan promises 4). */
static bool forge__runs_attn_decode(const forge__caps *c) {
    return c->subgroup_arith && c->subgroup_size <= 64 && c->props.limits.maxPerStageDescriptorStorageBuffers >= 13;
}

/* Reads everything forge needs to know about one physical device. */
static void forge__query_device(const forge__vkfn *vk, VkPhysicalDevice pd, forge__caps *c, forge_device_info *info) {
    memset(c, 0, sizeof *c);
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    VkPhysicalDeviceMaintenance3Properties m3 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
    VkPhysicalDeviceMaintenance4Properties m4 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_PROPERTIES, .pNext = &m3};
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES, .pNext = &m4};
    VkPhysicalDeviceDriverProperties drv = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, .pNext = &sg};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &drv};
    vk->vkGetPhysicalDeviceProperties(pd, &c->props);
    uint32_t n_ext = 0;
    vk->vkEnumerateDeviceExtensionProperties(pd, NULL, &n_ext, NULL);
    VkExtensionProperties *exts = (VkExtensionProperties *)calloc(n_ext ? n_ext : 1, sizeof *exts);
    if (exts) vk->vkEnumerateDeviceExtensionProperties(pd, NULL, &n_ext, exts);
    else n_ext = 0;
    bool has_m4 = c->props.apiVersion >= VK_API_VERSION_1_3 || forge__has_ext(exts, n_ext, "VK_KHR_maintenance4");
    if (!has_m4) sg.pNext = &m3;
    if (c->props.apiVersion >= VK_API_VERSION_1_1) vk->vkGetPhysicalDeviceProperties2(pd, &p2);
    bool has_idp = forge__has_ext(exts, n_ext, "VK_KHR_shader_integer_dot_product");
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR idp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, .pNext = has_idp ? &idp : NULL};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, .pNext = &f12};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
    if (c->props.apiVersion >= VK_API_VERSION_1_2) vk->vkGetPhysicalDeviceFeatures2(pd, &f2);

    switch (c->props.deviceType) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: c->type = FORGE_DEVICE_DISCRETE_GPU; break;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: c->type = FORGE_DEVICE_INTEGRATED_GPU; break;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: c->type = FORGE_DEVICE_VIRTUAL_GPU; break;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: c->type = FORGE_DEVICE_CPU; break;
    default: c->type = FORGE_DEVICE_OTHER; break;
    }
    c->max_storage_range = c->props.limits.maxStorageBufferRange;
    c->max_alloc = m3.maxMemoryAllocationSize ? m3.maxMemoryAllocationSize : ((uint64_t)1 << 30);
    c->max_buffer_size = has_m4 && m4.maxBufferSize ? m4.maxBufferSize : c->max_alloc;
    c->storage_align = c->props.limits.minStorageBufferOffsetAlignment ? c->props.limits.minStorageBufferOffsetAlignment : 16;
    if (c->storage_align < 16) c->storage_align = 16;
    c->subgroup_size = sg.subgroupSize ? sg.subgroupSize : 1;
    c->max_shared_bytes = c->props.limits.maxComputeSharedMemorySize;
    c->max_wg_invocations = c->props.limits.maxComputeWorkGroupInvocations;
    c->subgroup_arith = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) && (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) &&
                        c->subgroup_size >= 4 && c->subgroup_size <= 128;
    c->subgroup_shuffle = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) && (sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) &&
                          c->subgroup_size >= 8 && c->subgroup_size <= 128;
    c->fp16 = f12.shaderFloat16 && f11.storageBuffer16BitAccess;
    c->int8 = f12.shaderInt8 && f12.storageBuffer8BitAccess;
    c->int_dot = has_idp && idp.shaderIntegerDotProduct;
    c->coopmat = forge__has_ext(exts, n_ext, "VK_KHR_cooperative_matrix") || forge__has_ext(exts, n_ext, "VK_NV_cooperative_matrix");
    c->has_nv_coopmat_ext = forge__has_ext(exts, n_ext, "VK_NV_cooperative_matrix") && f12.shaderFloat16;
    free(exts);

    VkPhysicalDeviceMemoryProperties mp;
    vk->vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t h = 0; h < mp.memoryHeapCount; h++)
        if ((mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp.memoryHeaps[h].size > c->device_local_bytes)
            c->device_local_bytes = mp.memoryHeaps[h].size;
    /* Memory types: the first that has all `want` bits, preferring ones without `avoid`. */
    uint32_t best_dev = UINT32_MAX, best_up = UINT32_MAX, best_rb = UINT32_MAX, best_step = UINT32_MAX;
    for (uint32_t i = 0; i < mp.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = mp.memoryTypes[i].propertyFlags;
        if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && best_dev == UINT32_MAX) best_dev = i;
        if ((f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && (f & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)) {
            if (best_up == UINT32_MAX) best_up = i;
            if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && best_step == UINT32_MAX) best_step = i;
        }
        if (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) {
            bool cached = f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
            if (best_rb == UINT32_MAX || (cached && !(mp.memoryTypes[best_rb].propertyFlags & VK_MEMORY_PROPERTY_HOST_CACHED_BIT)))
                best_rb = i;
        }
    }
    c->mem_device = best_dev != UINT32_MAX ? best_dev : 0;
    c->mem_upload = best_up != UINT32_MAX ? best_up : c->mem_device;
    c->mem_readback = best_rb != UINT32_MAX ? best_rb : c->mem_upload;
    c->mem_step = best_step != UINT32_MAX ? best_step : c->mem_upload;
    c->readback_coherent = mp.memoryTypes[c->mem_readback].propertyFlags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    c->uma = (mp.memoryTypes[c->mem_device].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0;

    uint32_t nq = 0;
    vk->vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, NULL);
    VkQueueFamilyProperties qf[32];
    if (nq > 32) nq = 32;
    vk->vkGetPhysicalDeviceQueueFamilyProperties(pd, &nq, qf);
    c->queue_family = UINT32_MAX;
    for (uint32_t i = 0; i < nq; i++)
        if ((qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && c->queue_family == UINT32_MAX) {
            c->queue_family = i;
            c->timestamps = qf[i].timestampValidBits > 0 && c->props.limits.timestampPeriod > 0;
        }

    snprintf(info->name, sizeof info->name, "%s", c->props.deviceName);
    if (drv.driverName[0])
        snprintf(info->driver, sizeof info->driver, "%s %s", drv.driverName, drv.driverInfo);
    else
        snprintf(info->driver, sizeof info->driver, "driver %u", c->props.driverVersion);
    info->type = c->type;
    info->vendor_id = c->props.vendorID;
    info->api_version = c->props.apiVersion;
    info->device_local_bytes = c->device_local_bytes;
    info->max_storage_buffer_range = c->max_storage_range;
    info->max_allocation_size = c->max_alloc;
    info->max_buffer_size = c->max_buffer_size;
    info->subgroup_size = c->subgroup_size;
    info->fp16 = c->fp16;
    info->int8 = c->int8;
    info->integer_dot_product = c->int_dot;
    info->cooperative_matrix = c->coopmat;
    info->usable = c->props.apiVersion >= VK_API_VERSION_1_2 && c->queue_family != UINT32_MAX &&
                   c->max_wg_invocations >= 256 && c->max_shared_bytes >= 16384;
}

/* Enumerates devices in preference order (discrete, integrated, virtual, CPU, other). */
static forge_status forge__enumerate(const forge__vkfn *vk, VkInstance inst, VkPhysicalDevice *pds, forge__caps *caps,
                                     forge_device_info *infos, int cap, int *count, forge__err *err) {
    uint32_t n = 0;
    VkResult r = vk->vkEnumeratePhysicalDevices(inst, &n, NULL);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkEnumeratePhysicalDevices failed (VkResult %d)", (int)r);
    if (n > (uint32_t)cap) n = (uint32_t)cap;
    r = vk->vkEnumeratePhysicalDevices(inst, &n, pds);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) return forge__fail(err, FORGE_ERR_DEVICE, "vkEnumeratePhysicalDevices failed (VkResult %d)", (int)r);
    for (uint32_t i = 0; i < n; i++) forge__query_device(vk, pds[i], &caps[i], &infos[i]);
    /* stable insertion sort by type rank */
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && forge__type_rank(infos[j].type) < forge__type_rank(infos[j - 1].type); j--) {
            VkPhysicalDevice tp = pds[j]; pds[j] = pds[j - 1]; pds[j - 1] = tp;
            forge__caps tc = caps[j]; caps[j] = caps[j - 1]; caps[j - 1] = tc;
            forge_device_info ti = infos[j]; infos[j] = infos[j - 1]; infos[j - 1] = ti;
        }
    for (uint32_t i = 0; i < n; i++) infos[i].index = (int)i;
    *count = (int)n;
    return FORGE_OK;
}

#define FORGE__MAX_DEVICES 16

FORGE_API forge_status forge_list_devices(forge_device_info *out, int capacity, int *count, char *errmsg,
                                          size_t errmsg_size) {
    forge__err err = {{0}};
    forge__vkfn vk;
    VkInstance inst = VK_NULL_HANDLE;
    if (count) *count = 0;
    forge_status st = capacity > 0 && out ? forge__check_sized(out, "forge_device_info", &err) : FORGE_OK;
    if (st) {
        if (errmsg && errmsg_size) snprintf(errmsg, errmsg_size, "%s", err.msg);
        return st;
    }
    st = forge__vk_load(&vk, &err);
    if (!st) st = forge__vk_instance(&vk, &inst, &err);
    if (!st) {
        VkPhysicalDevice pds[FORGE__MAX_DEVICES];
        forge__caps caps[FORGE__MAX_DEVICES];
        forge_device_info infos[FORGE__MAX_DEVICES];
        int n = 0;
        st = forge__enumerate(&vk, inst, pds, caps, infos, FORGE__MAX_DEVICES, &n, &err);
        if (!st) {
            if (n == 0) st = forge__fail(&err, FORGE_ERR_DEVICE, "no Vulkan device found (install a driver; mesa-vulkan-drivers gives a CPU device)");
            if (out) forge__array_out(out, infos, FORGE__MIN(n, capacity), sizeof infos[0]);
            if (count) *count = n;
        }
        vk.vkDestroyInstance(inst, NULL);
    }
    if (vk.lib) dlclose(vk.lib);
    if (st && errmsg && errmsg_size) snprintf(errmsg, errmsg_size, "%s", err.msg);
    return st;
}

/* Creates the device chosen by index or name (else the preferred one). Limits from the
 * params lower the device's own, for tests of tensor splitting. */
static forge_status forge__device_open(forge__device *d, int index, const char *name, uint64_t max_range,
                                       uint64_t max_alloc, forge__err *err) {
    memset(d, 0, sizeof *d);
    forge_status st = forge__vk_load(&d->vk, err);
    if (st) return st;
    if ((st = forge__vk_instance(&d->vk, &d->instance, err))) return st;
    VkPhysicalDevice pds[FORGE__MAX_DEVICES];
    forge__caps caps[FORGE__MAX_DEVICES];
    forge_device_info infos[FORGE__MAX_DEVICES];
    int n = 0;
    if ((st = forge__enumerate(&d->vk, d->instance, pds, caps, infos, FORGE__MAX_DEVICES, &n, err))) return st;
    if (n == 0) return forge__fail(err, FORGE_ERR_DEVICE, "no Vulkan device found (install a driver; mesa-vulkan-drivers gives a CPU device)");
    int pick = -1;
    if (name && name[0]) {
        for (int i = 0; i < n && pick < 0; i++)
            if (strstr(infos[i].name, name)) pick = i;
        if (pick < 0) return forge__fail(err, FORGE_ERR_DEVICE, "no Vulkan device has a name containing '%s'", name);
    } else if (index >= 0) {
        if (index >= n) return forge__fail(err, FORGE_ERR_DEVICE, "device index %d out of range (%d devices)", index, n);
        pick = index;
    } else {
        for (int i = 0; i < n && pick < 0; i++)
            if (infos[i].usable) pick = i;
        if (pick < 0) return forge__fail(err, FORGE_ERR_DEVICE, "no usable Vulkan device (forge needs Vulkan 1.2 with compute)");
    }
    if (!infos[pick].usable)
        return forge__fail(err, FORGE_ERR_DEVICE, "device '%s' is not usable (forge needs Vulkan 1.2 with compute)", infos[pick].name);
    d->phys = pds[pick];
    d->caps = caps[pick];
    d->info = infos[pick];
    forge__caps *c = &d->caps;
    if (c->max_alloc > c->max_buffer_size) c->max_alloc = c->max_buffer_size;
    if (c->max_alloc > ((uint64_t)1 << 30)) c->max_alloc = (uint64_t)1 << 30; /* 1 GiB blocks, as ggml-vulkan */
    if (max_range && max_range < c->max_storage_range) c->max_storage_range = max_range;
    if (max_alloc && max_alloc < c->max_alloc) c->max_alloc = max_alloc;
    c->max_storage_range = c->max_storage_range / c->storage_align * c->storage_align;
    c->max_alloc = c->max_alloc / c->storage_align * c->storage_align;
    if (c->max_storage_range < 4096 || c->max_alloc < 4096)
        return forge__fail(err, FORGE_ERR_INVALID_ARGUMENT, "buffer limits below 4096 bytes (range %llu, allocation %llu)",
                           (unsigned long long)c->max_storage_range, (unsigned long long)c->max_alloc);

    float prio = 1.0f;
    VkDeviceQueueCreateInfo qci = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = c->queue_family,
                                   .queueCount = 1, .pQueuePriorities = &prio};
    /* Tensor cores through VK_NV_cooperative_matrix when the kernels were built with it and the
     * device multiplies fp16 16x16x16 into fp32 on 32-wide subgroups (matmul_cm.comp's layout). */
    const char *exts[2];
    uint32_t n_exts = 0;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cmf = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV,
                                                       .cooperativeMatrix = VK_TRUE};
    /* integer dot products (the extension: the instance asks for Vulkan 1.2, where it is not core) */
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR idp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR,
                                                              .shaderIntegerDotProduct = VK_TRUE};
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
#if FORGE_SPV_HAVE_NV_COOPERATIVE_MATRIX
    if (c->has_nv_coopmat_ext && c->subgroup_size == 32 && d->vk.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV) {
        VkCooperativeMatrixPropertiesNV props[64];
        uint32_t np = 0;
        d->vk.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(d->phys, &np, NULL);
        if (np > 64) np = 64;
        for (uint32_t i = 0; i < np; i++) props[i] = (VkCooperativeMatrixPropertiesNV){.sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV};
        d->vk.vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(d->phys, &np, props);
        for (uint32_t i = 0; i < np; i++) {
            const VkCooperativeMatrixPropertiesNV *p = &props[i];
            if (p->MSize == 16 && p->NSize == 16 && p->KSize == 16 && p->AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                p->BType == VK_COMPONENT_TYPE_FLOAT16_NV && p->CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                p->DType == VK_COMPONENT_TYPE_FLOAT32_NV && p->scope == VK_SCOPE_SUBGROUP_NV)
                c->coopmat_nv = true;
        }
    }
#endif
    if (c->coopmat_nv) {
        exts[n_exts++] = "VK_NV_cooperative_matrix";
        f12.shaderFloat16 = VK_TRUE;
        f12.pNext = &cmf;
    }
    if (c->int_dot) {
        exts[n_exts++] = "VK_KHR_shader_integer_dot_product";
        idp.pNext = f12.pNext;
        f12.pNext = &idp;
    }
    VkDeviceCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &f2, .queueCreateInfoCount = 1, .pQueueCreateInfos = &qci,
                              .enabledExtensionCount = n_exts, .ppEnabledExtensionNames = exts};
    VkResult r = d->vk.vkCreateDevice(d->phys, &dci, NULL, &d->dev);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkCreateDevice on '%s' failed (VkResult %d)", d->info.name, (int)r);
#define FORGE__VK_LOAD(fn) d->vk.fn = (PFN_##fn)d->vk.vkGetDeviceProcAddr(d->dev, #fn);
    FORGE__VK_DEVICE_FNS(FORGE__VK_LOAD)
#undef FORGE__VK_LOAD
    d->vk.vkGetDeviceQueue(d->dev, c->queue_family, 0, &d->queue);
    pthread_mutex_init(&d->queue_lock, NULL);
    return FORGE_OK;
}

static void forge__device_close(forge__device *d) {
    if (d->dev) {
        d->vk.vkDeviceWaitIdle(d->dev);
        d->vk.vkDestroyDevice(d->dev, NULL);
        pthread_mutex_destroy(&d->queue_lock);
    }
    if (d->instance) d->vk.vkDestroyInstance(d->instance, NULL);
    if (d->vk.lib) dlclose(d->vk.lib);
    memset(d, 0, sizeof *d);
}

/* Allocates one buffer with its own memory of type `mem_type`; maps it when host-visible. */
static forge_status forge__buffer_create(forge__device *d, uint64_t size, uint32_t mem_type, bool map,
                                         forge__mem_counter *owner, forge__mem_counter *total, forge__buffer *out,
                                         forge__err *err) {
    memset(out, 0, sizeof *out);
    if (size == 0) size = 16;
    if (size > d->caps.max_buffer_size)
        return forge__fail(err, FORGE_ERR_LIMIT, "buffer of %llu bytes exceeds the device's maxBufferSize %llu",
                           (unsigned long long)size, (unsigned long long)d->caps.max_buffer_size);
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = size,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkResult r = d->vk.vkCreateBuffer(d->dev, &bi, NULL, &out->buf);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkCreateBuffer(%llu bytes) failed (VkResult %d)", (unsigned long long)size, (int)r);
    VkMemoryRequirements req;
    d->vk.vkGetBufferMemoryRequirements(d->dev, out->buf, &req);
    if (!(req.memoryTypeBits & (1u << mem_type))) {
        d->vk.vkDestroyBuffer(d->dev, out->buf, NULL);
        out->buf = VK_NULL_HANDLE;
        return forge__fail(err, FORGE_ERR_DEVICE, "no compatible memory type for a storage buffer");
    }
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .allocationSize = req.size, .memoryTypeIndex = mem_type};
    r = d->vk.vkAllocateMemory(d->dev, &ai, NULL, &out->mem);
    if (r != VK_SUCCESS) {
        d->vk.vkDestroyBuffer(d->dev, out->buf, NULL);
        out->buf = VK_NULL_HANDLE;
        return forge__fail(err, r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY ? FORGE_ERR_OUT_OF_MEMORY : FORGE_ERR_DEVICE,
                           "allocating %llu bytes of device memory failed (VkResult %d)", (unsigned long long)req.size, (int)r);
    }
    d->vk.vkBindBufferMemory(d->dev, out->buf, out->mem, 0);
    if (map) {
        r = d->vk.vkMapMemory(d->dev, out->mem, 0, VK_WHOLE_SIZE, 0, &out->mapped);
        if (r != VK_SUCCESS) {
            d->vk.vkFreeMemory(d->dev, out->mem, NULL);
            d->vk.vkDestroyBuffer(d->dev, out->buf, NULL);
            memset(out, 0, sizeof *out);
            return forge__fail(err, FORGE_ERR_DEVICE, "vkMapMemory failed (VkResult %d)", (int)r);
        }
    }
    out->size = size;
    forge__mem_add(owner, total, req.size);
    owner->n_buffers++;
    return FORGE_OK;
}

static void forge__buffer_destroy(forge__device *d, forge__buffer *b, forge__mem_counter *owner, forge__mem_counter *total) {
    if (!b->buf) return;
    VkMemoryRequirements req;
    d->vk.vkGetBufferMemoryRequirements(d->dev, b->buf, &req);
    if (b->mapped) d->vk.vkUnmapMemory(d->dev, b->mem);
    d->vk.vkDestroyBuffer(d->dev, b->buf, NULL);
    d->vk.vkFreeMemory(d->dev, b->mem, NULL);
    forge__mem_sub(owner, total, req.size);
    owner->n_buffers--;
    memset(b, 0, sizeof *b);
}

/* Submits one command buffer and waits for it. The queue is shared by the model's sessions. */
static forge_status forge__submit_wait(forge__device *d, VkCommandBuffer cb, VkFence fence, forge__err *err) {
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    pthread_mutex_lock(&d->queue_lock);
    VkResult r = d->vk.vkQueueSubmit(d->queue, 1, &si, fence);
    pthread_mutex_unlock(&d->queue_lock);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkQueueSubmit failed (VkResult %d)", (int)r);
    r = d->vk.vkWaitForFences(d->dev, 1, &fence, VK_TRUE, UINT64_MAX);
    d->vk.vkResetFences(d->dev, 1, &fence);
    if (r != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkWaitForFences failed (VkResult %d): device lost?", (int)r);
    return FORGE_OK;
}

/* Fills device ranges with zeros, submitted and waited for (buffers that must start at zero). */
static forge_status forge__zero_ranges(forge__device *d, VkCommandPool pool, VkFence fence, const forge__range *ranges, int n, forge__err *err) {
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, .commandPool = pool,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VkCommandBuffer cb;
    if (d->vk.vkAllocateCommandBuffers(d->dev, &cai, &cb) != VK_SUCCESS) return forge__fail(err, FORGE_ERR_DEVICE, "vkAllocateCommandBuffers failed");
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
    d->vk.vkBeginCommandBuffer(cb, &bi);
    for (int i = 0; i < n; i++) d->vk.vkCmdFillBuffer(cb, ranges[i].buf, ranges[i].offset, forge__align_up(ranges[i].size, 4), 0);
    d->vk.vkEndCommandBuffer(cb);
    forge_status st = forge__submit_wait(d, cb, fence, err);
    d->vk.vkFreeCommandBuffers(d->dev, pool, 1, &cb);
    return st;
}

/* ---- Packing: many ranges into few allocations ----
 * A list of (size, alignment) requests is packed, in order, into blocks of at most
 * caps.max_alloc bytes; each request must fit the binding range. The plan (block sizes) is
 * known before anything is allocated: that is the memory plan forge reports. */

typedef struct forge__pack_item {
    uint64_t size;
    int block;         /* result: which block */
    uint64_t offset;   /* result: offset in the block */
} forge__pack_item;

typedef struct forge__pack {
    forge__pack_item *items;
    int n_items, cap_items;
    uint64_t *block_sizes;
    int n_blocks;
} forge__pack;

static int forge__pack_add(forge__pack *p, forge__arena *a, uint64_t size) {
    if (p->n_items == p->cap_items) {
        int cap = p->cap_items ? p->cap_items * 2 : 256;
        forge__pack_item *items = (forge__pack_item *)forge__arena_alloc(a, sizeof *items * (size_t)cap, 16);
        if (!items) return -1;
        if (p->n_items) memcpy(items, p->items, sizeof *items * (size_t)p->n_items);
        p->items = items;
        p->cap_items = cap;
    }
    p->items[p->n_items].size = size;
    return p->n_items++;
}

static forge_status forge__pack_plan(forge__pack *p, forge__arena *a, const forge__caps *c, forge__err *err) {
    p->block_sizes = (uint64_t *)forge__arena_alloc(a, sizeof(uint64_t) * (size_t)(p->n_items + 1), 16);
    if (!p->block_sizes) return forge__fail(err, FORGE_ERR_OUT_OF_MEMORY, "out of host memory");
    p->n_blocks = 0;
    uint64_t used = c->max_alloc; /* forces a first block */
    for (int i = 0; i < p->n_items; i++) {
        uint64_t sz = forge__align_up(p->items[i].size ? p->items[i].size : 16, 16);
        if (sz > c->max_storage_range || sz > c->max_alloc)
            return forge__fail(err, FORGE_ERR_LIMIT, "a buffer of %llu bytes exceeds the binding range %llu / allocation limit %llu",
                               (unsigned long long)sz, (unsigned long long)c->max_storage_range, (unsigned long long)c->max_alloc);
        uint64_t off = forge__align_up(used, c->storage_align);
        if (off + sz > c->max_alloc) {
            p->n_blocks++;
            off = 0;
        }
        p->items[i].block = p->n_blocks - 1;
        p->items[i].offset = off;
        used = off + sz;
        p->block_sizes[p->n_blocks - 1] = used;
    }
    return FORGE_OK;
}

static uint64_t forge__pack_total(const forge__pack *p) {
    uint64_t t = 0;
    for (int i = 0; i < p->n_blocks; i++) t += p->block_sizes[i];
    return t;
}

