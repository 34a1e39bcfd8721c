/* The Python module cuca.kernels._ckernels: argument checks, GIL release, dispatch to the kernels.
 * Only this file (and the module_*.inc files it includes) touch Python objects. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <numpy/arrayobject.h>
#include "cuca.h"

/* Each .inc defines static wrappers and a CUCA_*_METHODS list of PyMethodDef entries. */
#include "module_matmul.inc"
#include "module_ops.inc"
#include "module_deltanet.inc"
#include "module_hybrid.inc"
#include "module_pool.inc"

static PyMethodDef cuca_methods[] = {
    CUCA_MATMUL_METHODS
    CUCA_OPS_METHODS
    CUCA_DELTANET_METHODS
    CUCA_HYBRID_METHODS
    CUCA_POOL_METHODS
    {NULL, NULL, 0, NULL},
};

static int cuca_exec(PyObject *m) {
    if (PyModule_AddStringConstant(m, "ISA", cuca_isa_name()) < 0) return -1;
    return 0;
}

static PyModuleDef_Slot cuca_slots[] = {
    {Py_mod_exec, (void *)cuca_exec},
    {0, NULL},
};

static struct PyModuleDef cuca_module = {
    PyModuleDef_HEAD_INIT, "_ckernels", "cuca C kernels (matmul over GGUF blocks, attention, small ops)",
    0, cuca_methods, cuca_slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ckernels(void) {
    import_array();
    return PyModuleDef_Init(&cuca_module);
}
