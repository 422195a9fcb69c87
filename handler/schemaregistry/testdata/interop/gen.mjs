// gen.mjs writes the interop fixtures: record values framed by Confluent's
// own JavaScript serializers (@confluentinc/schemaregistry), against the
// registry at process.argv[2], into the directory process.argv[3]. Run it
// through gen.go (go run gen.go), which starts the in-memory registry,
// generates the Protobuf-ES code and writes the registry's schemas to
// fixtures/manifest.json.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { create, createMutableRegistry } from '@bufbuild/protobuf';
import {
  SchemaRegistryClient, ProtobufSerializer, AvroSerializer, JsonSerializer, SerdeType,
} from '@confluentinc/schemaregistry';
import { file_shop_order as fileV1, OrderPaidSchema as OrderPaidV1 } from './gen/v1/es/shop/order_pb.js';
import { file_shop_order as fileV2, OrderPaidSchema as OrderPaidV2 } from './gen/v2/es/shop/order_pb.js';

const [url, out] = process.argv.slice(2);
const client = new SchemaRegistryClient({ baseURLs: [url] });
const write = (name, buf) => writeFileSync(join(out, name), buf);

// Protobuf: a v1 producer, then a v2 producer (an added field), on one
// topic (subject orders.paid-value, TopicNameStrategy). The serializer
// registers the file's descriptor itself.
const pbV1 = new ProtobufSerializer(client, SerdeType.VALUE, { autoRegisterSchemas: true, registry: createMutableRegistry(fileV1) });
write('pb-v1-o1.bin', await pbV1.serialize('orders.paid', create(OrderPaidV1, { orderId: 'o-1', amountCents: 1250n })));
write('pb-v1-o2.bin', await pbV1.serialize('orders.paid', create(OrderPaidV1, { orderId: 'o-2', amountCents: 990n })));
const pbV2 = new ProtobufSerializer(client, SerdeType.VALUE, { autoRegisterSchemas: true, registry: createMutableRegistry(fileV2) });
write('pb-v2-o3.bin', await pbV2.serialize('orders.paid', create(OrderPaidV2, { orderId: 'o-3', amountCents: 700n, currency: 'EUR' })));

// Avro: v1, then v2 adding an optional field with a default, registered
// under payments-value; each serializer writes its version's id.
const avroV1 = {
  type: 'record', name: 'Payment', namespace: 'shop',
  fields: [{ name: 'payment_id', type: 'string' }, { name: 'amount', type: 'long' }],
};
const avroV2 = {
  ...avroV1,
  fields: [...avroV1.fields, { name: 'currency', type: ['null', 'string'], default: null }],
};
const avroV1ID = await client.register('payments-value', { schemaType: 'AVRO', schema: JSON.stringify(avroV1) });
const av1 = new AvroSerializer(client, SerdeType.VALUE, { useSchemaId: avroV1ID });
write('avro-v1-p1.bin', await av1.serialize('payments', { payment_id: 'p-1', amount: 500 }));
write('avro-v1-p2.bin', await av1.serialize('payments', { payment_id: 'p-2', amount: 800 }));
const avroV2ID = await client.register('payments-value', { schemaType: 'AVRO', schema: JSON.stringify(avroV2) });
const av2 = new AvroSerializer(client, SerdeType.VALUE, { useSchemaId: avroV2ID });
write('avro-v2-p3.bin', await av2.serialize('payments', { payment_id: 'p-3', amount: 300, currency: 'EUR' }));

// JSON Schema.
const refund = {
  type: 'object',
  properties: { refund_id: { type: 'string' }, amount: { type: 'integer' } },
  required: ['refund_id', 'amount'],
};
const refundID = await client.register('refunds-value', { schemaType: 'JSON', schema: JSON.stringify(refund) });
const js = new JsonSerializer(client, SerdeType.VALUE, { useSchemaId: refundID });
write('json-r1.bin', await js.serialize('refunds', { refund_id: 'r-1', amount: 40 }));
