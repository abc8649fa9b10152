//! `TransactionOps` for [`Autocast`]: a transaction handed to the inner backend, so a backend
//! that batches reads (CubeCL's) still does; counted as one host read.

use core::future::Future;

use burn::tensor::TransactionPrimitive;
use burn::tensor::backend::{Backend, ExecutionError};
use burn::tensor::ops::{TransactionOps, TransactionPrimitiveData};

use super::Autocast;

impl<B: Backend> TransactionOps<Self> for Autocast<B> {
    fn tr_execute(
        transaction: TransactionPrimitive<Self>,
    ) -> impl Future<Output = Result<TransactionPrimitiveData, ExecutionError>> + Send {
        // One read however many tensors it holds: the transaction waits once.
        crate::host_reads::add_read();
        B::tr_execute(TransactionPrimitive::<B>::new(
            transaction.read_floats,
            transaction.read_qfloats,
            transaction.read_ints,
            transaction.read_bools,
        ))
    }
}
